"""The 2026-07-28 request-metadata headers: the rules both ends of a modern HTTP request share. Pure functions.

A modern HTTP request mirrors body fields into headers (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name``,
and ``Mcp-Param-{Name}`` for the tool arguments its ``inputSchema`` annotates with ``x-mcp-header``) so
intermediaries can route without parsing the body; the body stays the source of truth. Values that would not
survive as a plain HTTP field value travel in the ``=?base64?...?=`` sentinel.

bastion writes these headers as a client (``upstream/headers.py``) and checks them as a server
(``server/headers.py``); what the two must agree on is here: the header names, which annotations are valid (a
tool with an invalid one is dropped by clients, so bastion drops it upstream and never serves it), the map from
argument paths to header names, and the sentinel encoding.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping
from typing import Any

from bastion.protocol.methods import PROMPTS_GET, RESOURCES_READ, TOOLS_CALL

__all__ = [
    "METHOD_HEADER",
    "NAME_FIELDS",
    "NAME_HEADER",
    "PARAM_PREFIX",
    "VERSION_HEADER",
    "X_MCP_HEADER",
    "HeaderMap",
    "decode_header_value",
    "encode_header_value",
    "header_map",
    "invalid_header_reason",
]

VERSION_HEADER = "MCP-Protocol-Version"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
X_MCP_HEADER = "x-mcp-header"
PARAM_PREFIX = "Mcp-Param-"
# The methods whose target is mirrored in Mcp-Name, and the params field that names it.
NAME_FIELDS: Mapping[str, str] = {TOOLS_CALL: "name", PROMPTS_GET: "name", RESOURCES_READ: "uri"}

# A property path (the chain of ``properties`` keys from the schema root) to its header token.
HeaderMap = Mapping[tuple[str, ...], str]

_SENTINEL = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")
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


def decode_header_value(value: str | None) -> str | None:
    """The value, with the ``=?base64?...?=`` sentinel decoded; ``None`` for a malformed sentinel.

    Non-canonical Base64 and invalid UTF-8 are malformed too, so a corrupt header never matches by accident.
    """
    if value is None:
        return None
    match = _SENTINEL.match(value)
    if match is None:
        return value
    payload = match.group("payload")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    if base64.b64encode(raw).decode("ascii") != payload:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
