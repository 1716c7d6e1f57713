"""Sanitize what servers say about themselves: tool, prompt and resource definitions and server instructions.

Every field is walked (``walk.Walker``), so a field this version does not know is text by default. What a
finding does depends on ``sanitize.definitions`` (docs/security.md, "Definitions"):

- ``neutralise`` (default): injection phrases, directive tags and references to other servers' tools are
  rewritten into visible ``[bastion: …]`` markers, and a text that had hidden characters removed says so;
- ``flag``: those are left as they are and only reported;
- ``block``: an item with any finding is hidden from clients.

In every mode hidden characters are removed, secrets redacted and unsafe icons or links dropped: those are never
wanted. A finding in a field that cannot be rewritten without changing what the tool accepts (property names,
``enum``, ``const``, ``pattern``, argument names, URIs) blocks the item, except in ``flag`` mode. The compiled
validator is built from the upstream's own schema; since only annotations are ever rewritten, it validates exactly
what the schema clients see says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal, NamedTuple

from bastion.sanitize.config import EffectiveSanitizePolicy
from bastion.sanitize.report import SanitizeReport
from bastion.sanitize.result import Sanitizer, uri_is_safe
from bastion.sanitize.walk import DROP, ToolRefs, Walker, finding_classes

Action = Literal["flagged", "neutralised", "blocked"]
# Classes whose text is rewritten whatever the mode: there is no legitimate reason to pass them on.
ALWAYS_REWRITTEN = frozenset({"secret", "invisible_characters", "hidden_instruction", "unsafe_url", "oversize"})
_IDENTIFIERS = {"tool": ("name",), "prompt": ("name",), "resource": ("uri", "uriTemplate")}


class Cleaned(NamedTuple):
    """A cleaned definition, what was found, and what each finding class led to."""

    definition: Any
    report: SanitizeReport
    actions: Mapping[str, Action]

    @property
    def blocked(self) -> bool:
        return "blocked" in self.actions.values()


def _walker(policy: EffectiveSanitizePolicy, report: SanitizeReport | None, refs: ToolRefs | None) -> Walker:
    mode = policy.definitions
    sanitizer = Sanitizer(replace(policy, injection="neutralise" if mode == "neutralise" else "flag"), report)
    return Walker(sanitizer, by_key=True, mark_hidden=mode == "neutralise", refs=refs,
                  neutralise_refs=mode == "neutralise")


def _finish(walker: Walker, definition: Any) -> Cleaned:
    mode = walker.s.policy.definitions
    actions: dict[str, Action] = {}
    for cls in sorted(finding_classes(walker.report.counts) | walker.semantic):
        if mode == "block" or (cls in walker.semantic and mode != "flag"):
            actions[cls] = "blocked"
        elif cls in walker.semantic:
            actions[cls] = "flagged"
        elif mode == "neutralise" or cls in ALWAYS_REWRITTEN:
            actions[cls] = "neutralised"
        else:
            actions[cls] = "flagged"
    return Cleaned(definition, walker.report, actions)


def _item(walker: Walker, item: Mapping[str, Any], kind: str) -> dict[str, Any]:
    walker.prescan(item)
    out: dict[str, Any] = {}
    identifiers = _IDENTIFIERS[kind]
    for key, value in item.items():
        if key in identifiers:
            out[key] = walker.keep(value, key)
            if kind == "resource" and isinstance(value, str) and not _uri_safe(value):
                walker.semantic.add("unsafe_url")
                walker.report.bump("unsafe_uri", key)
        elif kind == "tool" and key in ("inputSchema", "outputSchema"):
            out[key] = walker.schema(value, key)
        elif kind == "prompt" and key == "arguments" and isinstance(value, list):
            out[key] = [_argument(walker, a, f"arguments[{i}]") for i, a in enumerate(value)]
        else:
            new = walker.field(key, value, key)
            if new is not DROP:
                out[key] = new
    return out


def _uri_safe(uri: str) -> bool:
    """``uri_is_safe`` for the URI and for what follows each ``+`` of its scheme: a published resource URI is
    ``<prefix>+<upstream URI>``, and the upstream's own scheme is what a client may act on once it is unwrapped."""
    scheme = uri.partition(":")[0]
    return uri_is_safe(uri) and all(uri_is_safe(uri[i + 1:]) for i, c in enumerate(scheme) if c == "+")


def _argument(walker: Walker, arg: Any, where: str) -> Any:
    if not isinstance(arg, dict):
        return walker.value(arg, where)
    # The argument's name is what the client sends back: an identifier.
    out = {k: walker.keep(v, f"{where}.{k}") if k == "name" else walker.field(k, v, f"{where}.{k}")
           for k, v in arg.items()}
    return {k: v for k, v in out.items() if v is not DROP}


def sanitize_tool_definition(tool: Mapping[str, Any], policy: EffectiveSanitizePolicy,
                             report: SanitizeReport | None = None, refs: ToolRefs | None = None) -> Cleaned:
    """A new tool object with every text field cleaned; ``name`` and validation keywords are only scanned."""
    walker = _walker(policy, report, refs)
    return _finish(walker, _item(walker, tool, "tool"))


def sanitize_prompt_definition(prompt: Mapping[str, Any], policy: EffectiveSanitizePolicy,
                               report: SanitizeReport | None = None, refs: ToolRefs | None = None) -> Cleaned:
    walker = _walker(policy, report, refs)
    return _finish(walker, _item(walker, prompt, "prompt"))


def sanitize_resource_definition(resource: Mapping[str, Any], policy: EffectiveSanitizePolicy,
                                 report: SanitizeReport | None = None, refs: ToolRefs | None = None) -> Cleaned:
    """Resources and resource templates: ``uri``/``uriTemplate`` are identifiers, the rest is text."""
    walker = _walker(policy, report, refs)
    return _finish(walker, _item(walker, resource, "resource"))


def sanitize_instructions(instructions: str, policy: EffectiveSanitizePolicy,
                          report: SanitizeReport | None = None, refs: ToolRefs | None = None) -> Cleaned:
    """The ``instructions`` string of an upstream's initialize (or discover) result."""
    walker = _walker(policy, report, refs)
    return _finish(walker, walker.text(instructions, "instructions"))
