"""Sanitize what servers say about themselves: tool, prompt and resource definitions and server instructions.

The same cleaning and redaction as results, applied to every human-readable field (including ``description``
and ``title`` nested anywhere in a schema). Injection patterns and hidden content are only flagged here, as
``report.findings`` with the field path: rewriting a definition's wording would change the tool, and pinning
(docs/pinning.md) is what stops a definition from changing under a client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bastion.sanitize.config import EffectiveSanitizePolicy
from bastion.sanitize.report import SanitizeReport
from bastion.sanitize.result import Sanitizer

_TEXT_FIELDS = ("title", "description")
_SCHEMA_MAX_DEPTH = 64


def _walker(policy: EffectiveSanitizePolicy, report: SanitizeReport | None) -> Sanitizer:
    return Sanitizer(replace(policy, injection="flag"), report)


def _fields(walker: Sanitizer, obj: Mapping[str, Any], prefix: str, keys: tuple[str, ...]) -> dict[str, Any]:
    out = dict(obj)
    for key in keys:
        if isinstance(obj.get(key), str):
            out[key] = walker.string(obj[key], walker.policy.max_item_bytes, f"{prefix}{key}")
    return out


def _schema(walker: Sanitizer, node: Any, where: str, depth: int = 0) -> Any:
    """``title``/``description`` strings at any depth; property names and other keywords are left alone."""
    if depth > _SCHEMA_MAX_DEPTH:
        return node
    if isinstance(node, Mapping):
        out = {}
        for key, value in node.items():
            path = f"{where}.{key}"
            if key in _TEXT_FIELDS and isinstance(value, str):
                out[key] = walker.string(value, walker.policy.max_item_bytes, path)
            else:
                out[key] = _schema(walker, value, path, depth + 1)
        return out
    if isinstance(node, list):
        return [_schema(walker, v, f"{where}[{i}]", depth + 1) for i, v in enumerate(node)]
    return node


def sanitize_tool_definition(tool: Mapping[str, Any], policy: EffectiveSanitizePolicy,
                             report: SanitizeReport | None = None) -> tuple[dict[str, Any], SanitizeReport]:
    """A new tool object with description, title, annotations.title and schema texts sanitized.

    ``name`` is not touched (it is validated and namespaced by the catalogue).
    """
    walker = _walker(policy, report)
    out = _fields(walker, tool, "", _TEXT_FIELDS)
    annotations = tool.get("annotations")
    if isinstance(annotations, Mapping):
        out["annotations"] = _fields(walker, annotations, "annotations.", ("title",))
    for key in ("inputSchema", "outputSchema"):
        if isinstance(tool.get(key), Mapping):
            out[key] = _schema(walker, tool[key], key)
    return out, walker.report


def sanitize_prompt_definition(prompt: Mapping[str, Any], policy: EffectiveSanitizePolicy,
                               report: SanitizeReport | None = None) -> tuple[dict[str, Any], SanitizeReport]:
    walker = _walker(policy, report)
    out = _fields(walker, prompt, "", _TEXT_FIELDS)
    arguments = prompt.get("arguments")
    if isinstance(arguments, list):
        out["arguments"] = [_fields(walker, a, f"arguments[{i}].", _TEXT_FIELDS) if isinstance(a, Mapping) else a
                            for i, a in enumerate(arguments)]
    return out, walker.report


def sanitize_resource_definition(resource: Mapping[str, Any], policy: EffectiveSanitizePolicy,
                                 report: SanitizeReport | None = None) -> tuple[dict[str, Any], SanitizeReport]:
    """Resources and resource templates: name, title, description."""
    walker = _walker(policy, report)
    return _fields(walker, resource, "", ("name", *_TEXT_FIELDS)), walker.report


def sanitize_instructions(instructions: str, policy: EffectiveSanitizePolicy,
                          report: SanitizeReport | None = None) -> tuple[str, SanitizeReport]:
    """The ``instructions`` string of an upstream's initialize (or discover) result."""
    walker = _walker(policy, report)
    return walker.string(instructions, walker.policy.max_item_bytes, "instructions"), walker.report
