"""A deterministic, realistic catalogue: many upstreams of many tools, each about 1.3 KB as listed.

Used by ``bench/bench_catalogue_build.py`` and the catalogue build tests. Every tool has a title, a description of
a few sentences, an input schema of three to six described properties (enums, bounds, defaults, arrays), an
output schema with a nested item object, and annotations; names, words and shapes vary with the tool, so neither
definitions nor schemas repeat (a cache keyed by schema must not make the figures look better than a real fleet).
"""

from __future__ import annotations

import random
from typing import Any

from bastion.catalogue import UpstreamLists

_VERBS = ("search", "get", "list", "create", "update", "delete", "archive", "export", "sync", "describe",
          "resolve", "annotate", "merge", "tag", "assign", "schedule")
_NOUNS = ("issue", "ticket", "file", "document", "invoice", "order", "customer", "repository", "pipeline",
          "deployment", "alert", "incident", "calendar_event", "contact", "dataset", "report", "snapshot",
          "volume", "cluster", "message")
_WORDS = ("returns", "the", "matching", "records", "sorted", "by", "relevance", "with", "their", "identifier",
          "status", "owner", "and", "last", "modified", "time", "use", "this", "before", "creating", "a", "new",
          "one", "to", "avoid", "duplicates", "results", "are", "paginated", "at", "most", "items", "per", "call",
          "filters", "combine", "an", "empty", "query", "lists", "everything", "visible", "caller", "workspace")
_PROPS = (("query", "string"), ("limit", "integer"), ("state", "string"), ("labels", "array"),
          ("since", "string"), ("include_archived", "boolean"), ("owner", "string"), ("priority", "integer"),
          ("region", "string"), ("page_token", "string"), ("fields", "array"), ("dry_run", "boolean"))


def _sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(_WORDS) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def _property(rng: random.Random, name: str, kind: str) -> dict[str, Any]:
    prop: dict[str, Any] = {"type": kind, "description": _sentence(rng, rng.randint(6, 14))}
    if kind == "integer":
        prop.update(minimum=1, maximum=rng.choice((50, 100, 500)), default=rng.choice((10, 20, 25)))
    elif kind == "array":
        prop["items"] = {"type": "string", "maxLength": 64}
    elif name == "state":
        prop["enum"] = ["open", "closed", "all"]
    elif name == "since":
        prop["format"] = "date-time"
    return prop


def tool(rng: random.Random, upstream: int, index: int) -> dict[str, Any]:
    """One tool definition as an upstream lists it (about 1.3 KB of JSON)."""
    verb, noun = _VERBS[index % len(_VERBS)], _NOUNS[(index * 7 + upstream) % len(_NOUNS)]
    name = f"{verb}_{noun}_{index}"
    props = rng.sample(_PROPS, rng.randint(3, 5))
    title = f"{verb.capitalize()} {noun.replace('_', ' ')}s"
    return {
        "name": name,
        "title": title,
        "description": " ".join(_sentence(rng, rng.randint(10, 16)) for _ in range(2)),
        "inputSchema": {
            "type": "object",
            "properties": {p: _property(rng, p, kind) for p, kind in props},
            "required": [props[0][0]],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "items": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}, "title": {"type": "string"},
                                   "updated": {"type": "string", "format": "date-time"}},
                    "required": ["id"]}},
                "next": {"type": ["string", "null"], "description": _sentence(rng, 6)},
            },
            "required": ["items"],
        },
        "annotations": {"title": title, "readOnlyHint": verb in ("search", "get", "list", "describe", "export"),
                        "destructiveHint": verb == "delete", "idempotentHint": verb != "create",
                        "openWorldHint": rng.random() < 0.3},
    }


def upstream_lists(upstreams: int = 20, tools: int = 100, seed: int = 19) -> dict[str, UpstreamLists]:
    """``upstreams`` upstreams named ``up00``… (prefix ``u00``…), each listing ``tools`` tools."""
    rng = random.Random(seed)
    return {f"up{u:02d}": UpstreamLists(name=f"up{u:02d}", prefix=f"u{u:02d}",
                                        tools=[tool(rng, u, i) for i in range(tools)])
            for u in range(upstreams)}
