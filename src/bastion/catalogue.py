"""The merged catalogue: upstream tools, prompts and resources under public names. Pure; no I/O.

A ``Catalogue`` is immutable and swapped whole when any upstream's lists change, so a request always sees one
consistent version. Public names are ``<prefix><separator><name>`` (``files__read_file``), or the upstream's own
name for an upstream configured without a prefix. Entries are kept sorted by public name: that order is
deterministic (the 2026-07-28 revision asks for it) and makes keyset pagination possible, so cursors stay valid
across catalogue refreshes and across replicas without any shared state.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import structlog

from bastion.errors import InvalidParams
from bastion.tool_entry import ToolEntry
from bastion.uris import try_canonical

log = structlog.get_logger("bastion.catalogue")

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_CURSOR_PREFIX = "b1."


@dataclass(frozen=True, slots=True)
class UpstreamLists:
    """What one upstream offered, all pages followed."""

    name: str
    prefix: str | None
    tools: Sequence[Mapping[str, Any]] = ()
    prompts: Sequence[Mapping[str, Any]] = ()
    resources: Sequence[Mapping[str, Any]] = ()
    templates: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True, slots=True)
class PromptEntry:
    public_name: str
    upstream: str
    original_name: str
    definition: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Dropped:
    upstream: str
    name: str
    reason: str
    kind: str = "tool"  # tool | prompt | resource | template


@dataclass(frozen=True, slots=True)
class Catalogue:
    tools: tuple[ToolEntry, ...] = ()
    prompts: tuple[PromptEntry, ...] = ()
    resources: tuple[tuple[str, Mapping[str, Any]], ...] = ()  # (upstream, public resource)
    templates: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    prefixes: Mapping[str, str] = field(default_factory=dict)  # prefix -> upstream
    dropped: tuple[Dropped, ...] = ()
    version: str = ""
    _by_name: Mapping[str, ToolEntry] = field(default_factory=dict)
    _prompts_by_name: Mapping[str, PromptEntry] = field(default_factory=dict)

    def tool(self, public_name: str) -> ToolEntry | None:
        return self._by_name.get(public_name)

    def prompt(self, public_name: str) -> PromptEntry | None:
        return self._prompts_by_name.get(public_name)

    def replaced(self, *, tools: Sequence[ToolEntry], prompts: Sequence[PromptEntry],
                 resources: Sequence[tuple[str, Mapping[str, Any]]],
                 templates: Sequence[tuple[str, Mapping[str, Any]]]) -> Catalogue:
        """The same catalogue version with rewritten entries (same names, same order), indexes rebuilt."""
        return Catalogue(tools=tuple(tools), prompts=tuple(prompts), resources=tuple(resources),
                         templates=tuple(templates), prefixes=self.prefixes, dropped=self.dropped,
                         version=self.version, _by_name={t.public_name: t for t in tools},
                         _prompts_by_name={p.public_name: p for p in prompts})


def public_name(prefix: str | None, name: str, separator: str) -> str:
    return f"{prefix}{separator}{name}" if prefix else name


@dataclass(frozen=True, slots=True)
class Naming:
    """The configured naming (each upstream's prefix, the separator) read backwards: which upstream a public tool
    or prompt name, or a public resource URI, is of, without a live catalogue. What ``bastion policy explain
    --config`` and the console's explain form decide with when the catalogue does not list the target: a rule's
    ``upstreams`` must meet the upstream the gateway would, not a guess from the name."""

    # prefix -> upstream; None: no config at hand, so the default naming is assumed (each upstream's prefix is its
    # name, ``__`` between), as ``bastion policy test`` cases and ``policy explain`` without ``--config`` do.
    prefixes: Mapping[str, str] | None = None
    unprefixed: tuple[str, ...] = ()
    separator: str = "__"

    @classmethod
    def of(cls, upstreams: Iterable[Any], separator: str) -> Naming:
        """From the configured upstreams (``name``, ``prefix``) and ``catalogue.separator``."""
        listed = list(upstreams)
        return cls(prefixes={u.prefix: u.name for u in listed if u.prefix},
                   unprefixed=tuple(u.name for u in listed if not u.prefix), separator=separator)

    def upstreams_of_name(self, public: str) -> tuple[str, ...]:
        """Every upstream ``public`` could name a tool or prompt of (``public_name`` backwards): those whose prefix
        and separator begin it with a name left after them; failing that, the unprefixed upstreams."""
        if self.prefixes is None:
            head, sep, rest = public.partition(self.separator)
            return (head,) if sep and head and rest else ()
        prefixed = tuple(up for prefix, up in self.prefixes.items()
                         if public.startswith(prefix + self.separator) and len(public) > len(prefix + self.separator))
        return prefixed or self.unprefixed

    def upstreams_of_uri(self, uri: str) -> tuple[str, ...]:
        """Every upstream a public resource URI (in canonical form) could be of: ``route_uri`` without the
        listings, which tell the unprefixed upstreams' URIs apart."""
        if self.prefixes is None:
            head, sep, rest = uri.partition("+")
            return (head,) if sep and head and ":" not in head and ":" in rest else ()
        routed = prefixed_uri(self.prefixes, uri)
        return (routed[0],) if routed is not None else self.unprefixed


def build(lists: Iterable[UpstreamLists], *, separator: str = "__",
          on_collision: Literal["first", "reject"] = "first") -> Catalogue:
    """Merge upstream lists, in config order, into one catalogue.

    Collisions are never silent: with ``first`` the earlier upstream (config order) keeps the name and the later
    tool is dropped with a warning; with ``reject`` every tool claiming the name is dropped with an error.
    """
    ordered = list(lists)
    dropped: list[Dropped] = []
    claims: dict[str, list[ToolEntry]] = {}
    for up in ordered:
        seen_here: set[str] = set()
        for tool in up.tools:
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                dropped.append(Dropped(up.name, str(name), "tool without a name"))
                continue
            if name in seen_here:
                dropped.append(Dropped(up.name, name, "upstream listed the same tool twice"))
                continue
            seen_here.add(name)
            public = public_name(up.prefix, name, separator)
            if not TOOL_NAME.match(public):
                dropped.append(Dropped(up.name, name, f"public name {public[:140]!r} is not 1-128 characters of "
                                                      "[A-Za-z0-9_.-]"))
                continue
            definition = {**tool, "name": public}
            claims.setdefault(public, []).append(
                ToolEntry(public_name=public, upstream=up.name, original_name=name, definition=definition,
                          upstream_definition=tool))

    tools: list[ToolEntry] = []
    for public, entries in claims.items():
        if len(entries) == 1:
            tools.append(entries[0])
            continue
        owners = ", ".join(e.upstream for e in entries)
        if on_collision == "first":
            tools.append(entries[0])
            dropped.extend(Dropped(loser.upstream, loser.original_name,
                                   f"name {public!r} collides with upstream {entries[0].upstream!r} "
                                   "(on_collision: first)") for loser in entries[1:])
        else:
            dropped.extend(Dropped(loser.upstream, loser.original_name,
                                   f"name {public!r} claimed by {owners} (on_collision: reject)")
                           for loser in entries)
    tools.sort(key=lambda e: e.public_name)

    prompts = _prompts(ordered, separator, dropped)
    resources, templates = _resources(ordered)
    prefixes = {up.prefix: up.name for up in ordered if up.prefix}
    digest = hashlib.sha256(orjson.dumps(
        [[t.public_name, t.upstream_definition] for t in tools], option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    for d in dropped:
        log.warning("catalogue.tool_dropped", upstream=d.upstream, tool=d.name, reason=d.reason)
    return Catalogue(
        tools=tuple(tools), prompts=tuple(prompts), resources=tuple(resources), templates=tuple(templates),
        prefixes=prefixes, dropped=tuple(dropped), version=digest,
        _by_name={t.public_name: t for t in tools}, _prompts_by_name={p.public_name: p for p in prompts},
    )


def _prompts(ordered: list[UpstreamLists], separator: str, dropped: list[Dropped]) -> list[PromptEntry]:
    out: dict[str, PromptEntry] = {}
    for up in ordered:
        for prompt in up.prompts:
            name = prompt.get("name")
            if not isinstance(name, str) or not name:
                continue
            public = public_name(up.prefix, name, separator)
            if public in out:
                dropped.append(Dropped(up.name, name, f"prompt name {public!r} collides", "prompt"))
                continue
            out[public] = PromptEntry(public, up.name, name, {**prompt, "name": public})
    return sorted(out.values(), key=lambda p: p.public_name)


# Resource URIs. A prefixed upstream's URIs are published as ``<prefix>+<uri>`` (``files+file:///a.txt``): still a
# valid URI (``+`` is allowed in schemes), reversible without a lookup table, and unique across upstreams. An
# unprefixed upstream's URIs pass through unchanged and are routed by the table built from its listings.


def public_uri(prefix: str | None, uri: str) -> str:
    return f"{prefix}+{uri}" if prefix else uri


def _resources(ordered: list[UpstreamLists]) -> tuple[list[tuple[str, Mapping[str, Any]]],
                                                        list[tuple[str, Mapping[str, Any]]]]:
    resources: list[tuple[str, Mapping[str, Any]]] = []
    templates: list[tuple[str, Mapping[str, Any]]] = []
    for up in ordered:
        for res in up.resources:
            uri = res.get("uri")
            if isinstance(uri, str):
                resources.append((up.name, {**res, "uri": public_uri(up.prefix, uri)}))
        for tpl in up.templates:
            uri_t = tpl.get("uriTemplate")
            if isinstance(uri_t, str):
                templates.append((up.name, {**tpl, "uriTemplate": public_uri(up.prefix, uri_t)}))
    return resources, templates


def route_uri(catalogue: Catalogue, uri: str, unprefixed: Sequence[str]) -> tuple[str, str] | None:
    """Map a public resource URI in canonical form (``bastion.uris.canonical_uri``) to (upstream, original URI).

    The original URI is the canonical one without the prefix: what the policy judged is what the upstream is sent.
    An unprefixed upstream's listed URIs and templates are compared in canonical form too."""
    routed = prefixed_uri(catalogue.prefixes, uri)
    if routed is not None:
        return routed
    for upstream, res in catalogue.resources:
        listed = res.get("uri")
        if upstream in unprefixed and isinstance(listed, str) and (listed == uri or try_canonical(listed) == uri):
            return upstream, uri
    for upstream, tpl in catalogue.templates:
        if upstream in unprefixed and _template_matches(str(tpl.get("uriTemplate")), uri):
            return upstream, uri
    if len(unprefixed) == 1:
        return unprefixed[0], uri
    return None


def prefixed_uri(prefixes: Mapping[str, str], uri: str) -> tuple[str, str] | None:
    """(upstream, original URI) for a URI published as ``<prefix>+<uri>`` (``public_uri``), else None."""
    head, sep, rest = uri.partition("+")
    if sep and head in prefixes and ":" in rest:
        return prefixes[head], rest
    return None


def _template_matches(template: str, uri: str) -> bool:
    # RFC 6570 level-1 matching is enough to route: literal parts must match, expressions match anything.
    parts = re.split(r"\{[^}]*\}", try_canonical(template) or template)
    pattern = ".*".join(re.escape(p) for p in parts)
    return re.fullmatch(pattern, uri) is not None


# Cursors: keyset pagination over the sorted public names. Opaque to clients (base64url), but deliberately not
# secret: the cursor only says "after this name", and every page is filtered by the caller's own policy anyway.


def encode_cursor(after: str) -> str:
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(after.encode()).decode().rstrip("=")


def decode_cursor(cursor: Any) -> str:
    if not isinstance(cursor, str) or not cursor.startswith(_CURSOR_PREFIX):
        raise InvalidParams("Invalid cursor")
    body = cursor[len(_CURSOR_PREFIX):]
    try:
        # validate=True: a cursor with characters outside the alphabet is malformed, not silently trimmed.
        return base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidParams("Invalid cursor") from None


def page(names_sorted: Sequence[str], cursor: Any, size: int) -> tuple[int, int, str | None]:
    """Return (start, end, next cursor) over an already sorted, already filtered name list."""
    import bisect

    start = 0
    if cursor is not None:
        after = decode_cursor(cursor)
        start = bisect.bisect_right(names_sorted, after)
    end = min(start + size, len(names_sorted))
    next_cursor = encode_cursor(names_sorted[end - 1]) if end < len(names_sorted) else None
    return start, end, next_cursor
