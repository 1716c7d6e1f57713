"""The 2026-07-28 request-metadata headers, as pure functions: what a modern HTTP request mirrors from its body,
and which tools' ``x-mcp-header`` annotations are invalid (such tools must be dropped from the catalogue).

A header mirrors a body value; the body stays the source of truth. Values that would not survive as a plain HTTP
field value go in the ``=?base64?...?=`` sentinel.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "HeaderMap",
    "encode_header_value",
    "header_map",
    "invalid_header_reason",
    "invalid_header_tools",
    "param_headers",
    "request_headers",
]

X_MCP_HEADER = "x-mcp-header"
PARAM_PREFIX = "Mcp-Param-"
NAME_FIELDS: Mapping[str, str] = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

# A property path (the chain of ``properties`` keys from the schema root) to its header token.
HeaderMap = Mapping[tuple[str, ...], str]

_SENTINEL = re.compile(r"^=\?base64\?.*\?=$")
_PLAIN = re.compile(r"^[\x20-\x7e]*$")
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HEADER_TYPES = frozenset({"string", "integer", "boolean"})
_SAFE_INTEGER = 2**53 - 1

# JSON Schema 2020-12 keywords whose values are schema positions. Only ``properties`` keeps a position reachable
# "via properties keys only"; crossing any of these makes an annotation below it invalid. ``$ref`` is never
# followed, so a walk always ends.
_SINGLE = frozenset({"items", "contains", "unevaluatedItems", "additionalProperties", "propertyNames",
                     "unevaluatedProperties", "not", "if", "then", "else", "contentSchema"})
_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_MAP = frozenset({"patternProperties", "dependentSchemas", "$defs", "definitions"})


def _positions(root: Any) -> Iterator[tuple[tuple[str, ...] | None, Mapping[str, Any]]]:
    """Every schema position with its ``properties`` path (``None`` once another applicator was crossed)."""
    stack: list[tuple[tuple[str, ...] | None, Any]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, Mapping):
            continue
        yield path, node
        for keyword, value in node.items():
            if keyword == "properties" and isinstance(value, Mapping):
                stack.extend(((*path, str(k)) if path is not None else None, v) for k, v in value.items())
            elif keyword in _SINGLE:
                stack.append((None, value))
            elif keyword in _LIST and isinstance(value, list):
                stack.extend((None, v) for v in value)
            elif keyword in _MAP and isinstance(value, Mapping):
                stack.extend((None, v) for v in value.values())


def invalid_header_reason(input_schema: Any) -> str | None:
    """Why this ``inputSchema``'s ``x-mcp-header`` annotations are invalid, or ``None`` when they are all valid."""
    seen: dict[str, str] = {}
    for path, schema in _positions(input_schema):
        if X_MCP_HEADER not in schema:
            continue
        if not path:
            return "x-mcp-header outside a property reachable through 'properties' alone"
        where = ".".join(path)
        token = schema[X_MCP_HEADER]
        if not isinstance(token, str) or not _TOKEN.match(token):
            return f"property {where!r}: x-mcp-header must be a non-empty HTTP token"
        kind = schema.get("type")
        if kind not in _HEADER_TYPES:
            return f"property {where!r}: x-mcp-header is only allowed on string, integer and boolean properties"
        folded = token.lower()
        if folded in seen:
            return f"property {where!r}: x-mcp-header {token!r} duplicates the one on {seen[folded]!r}"
        seen[folded] = where
    return None


def invalid_header_tools(tools: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Tool name → reason, for every tool whose ``x-mcp-header`` annotations are invalid."""
    invalid: dict[str, str] = {}
    for tool in tools:
        reason = invalid_header_reason(tool.get("inputSchema"))
        if reason is not None:
            invalid[str(tool.get("name"))] = reason
    return invalid


def header_map(input_schema: Any) -> dict[tuple[str, ...], str]:
    """The annotated properties of a schema that ``invalid_header_reason`` accepts."""
    return {path: schema[X_MCP_HEADER] for path, schema in _positions(input_schema)
            if path and isinstance(schema.get(X_MCP_HEADER), str)}


def encode_header_value(value: str) -> str:
    """The value itself when it is plain printable ASCII without edge spaces (and does not look like the
    sentinel); otherwise its UTF-8 bytes in the Base64 sentinel."""
    if _PLAIN.match(value) and value == value.strip() and not _SENTINEL.match(value):
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="


def _render(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) <= _SAFE_INTEGER else None
    if isinstance(value, float) and value.is_integer() and abs(value) <= _SAFE_INTEGER:
        return str(int(value))
    if isinstance(value, str):
        return value
    return None


def param_headers(headers: HeaderMap, arguments: Any) -> dict[str, str]:
    """``Mcp-Param-{Name}`` for each annotated argument that is present; absent and ``null`` ones are omitted."""
    out: dict[str, str] = {}
    for path, token in headers.items():
        node: Any = arguments
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        rendered = _render(node) if node is not None else None
        if rendered is not None:
            out[PARAM_PREFIX + token] = encode_header_value(rendered)
    return out


def request_headers(method: str, params: Mapping[str, Any] | None, version: str,
                    tool_headers: HeaderMap | None = None) -> dict[str, str]:
    """The headers mirroring one modern request's body: version, method, name and annotated arguments."""
    out = {"MCP-Protocol-Version": version, "Mcp-Method": method}
    field = NAME_FIELDS.get(method)
    if field is not None and params is not None:
        name = params.get(field)
        if isinstance(name, str):
            out["Mcp-Name"] = encode_header_value(name)
    if method == "tools/call" and tool_headers and params is not None:
        out.update(param_headers(tool_headers, params.get("arguments")))
    return out
