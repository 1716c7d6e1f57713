"""Front-door validation of the 2026-07-28 request-metadata headers against the body. Pure functions.

A modern HTTP request mirrors body fields into headers (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name``,
``Mcp-Param-{Name}``) so intermediaries can route without parsing. The body stays the source of truth, and a
server that parses it must refuse any disagreement (400 + -32020): otherwise a load balancer, rate limiter or
WAF in front of bastion could be steered by headers that say one thing while the body does another.

The checks follow the reference SDK's order so clients see the same error for the same defect: the envelope's
presence first (-32602, checked by the caller), then these headers (-32020), then version support (-32022).
Unknown ``Mcp-Param-*`` headers (no annotated argument) are ignored, as the spec asks of servers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from bastion.errors import HEADER_MISMATCH, ProtocolError
from bastion.protocol import headers as h
from bastion.protocol.headers import NAME_FIELDS, PARAM_PREFIX, decode_header_value, header_map, invalid_header_reason
from bastion.protocol.methods import TOOLS_CALL

__all__ = ["HeaderMismatch", "check_request_headers", "decode_header_value"]

# Header names as this module compares them (folded to lower case).
VERSION_HEADER = h.VERSION_HEADER.lower()
METHOD_HEADER = h.METHOD_HEADER.lower()
NAME_HEADER = h.NAME_HEADER.lower()
# Routing headers a reader could take either copy of: a duplicate is refused, as readers would disagree.
ROUTING_HEADERS = frozenset({VERSION_HEADER, METHOD_HEADER, NAME_HEADER})

_DECIMAL = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")


class HeaderMismatch(ProtocolError):
    """A request-metadata header is missing, duplicated or disagrees with the body: 400 + -32020."""

    def __init__(self, message: str) -> None:
        super().__init__(HEADER_MISMATCH, message, http_status=400)


def _render(value: Any) -> str | None:
    """How a client mirrors an argument into a header, or ``None`` when it cannot (objects, arrays)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float | str):
        return str(value)
    return None


def _matches(kind: Any, value: Any, rendered: str, decoded: str) -> bool:
    # Integers compare numerically ("42" matches 42.0), as the spec recommends; everything else as text.
    if kind == "integer" and not isinstance(value, bool) and isinstance(value, int | float) and \
            _DECIMAL.match(decoded):
        whole, _, fraction = decoded.partition(".")
        return (not fraction or set(fraction) == {"0"}) and int(whole) == value
    return decoded == rendered


def _fold(pairs: Iterable[tuple[str, str]]) -> tuple[dict[str, str], set[str]]:
    folded: dict[str, str] = {}
    duplicated: set[str] = set()
    for name, value in pairs:
        key = name.lower()
        if key in folded:
            duplicated.add(key)
        folded[key] = value
    return folded, duplicated


def _argument(arguments: Any, path: tuple[str, ...]) -> Any:
    node = arguments
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def check_param_headers(input_schema: Any, arguments: Any, folded: Mapping[str, str],
                        duplicated: set[str]) -> None:
    """Every ``x-mcp-header`` argument of the called tool and its ``Mcp-Param-*`` header: both present and equal
    after decoding, or both absent (``null`` is absent)."""
    if invalid_header_reason(input_schema) is not None:
        return  # clients drop such tools and send no headers for them (bastion drops them upstream too)
    properties = _properties(input_schema)
    for path, token in header_map(input_schema).items():
        header = PARAM_PREFIX + token
        key = header.lower()
        raw = folded.get(key)
        where = ".".join(path)
        if raw is not None and key in duplicated:
            raise HeaderMismatch(f"{header} header appears more than once")
        value = _argument(arguments, path)
        rendered = _render(value) if value is not None else None
        if rendered is None:
            if raw is not None:
                raise HeaderMismatch(f"{header} header is present but the body has no value for {where!r}")
            continue
        if raw is None:
            raise HeaderMismatch(f"{header} header is missing; the body has a value for {where!r}")
        decoded = decode_header_value(raw)
        if decoded is None:
            raise HeaderMismatch(f"{header} header carries a malformed base64 value")
        if not _matches(properties.get(path, {}).get("type"), value, rendered, decoded):
            raise HeaderMismatch(f"{header} header does not match the body's {where!r} argument")


def _properties(schema: Any) -> dict[tuple[str, ...], Mapping[str, Any]]:
    """Property schemas reachable through ``properties`` alone, by path (where annotations are allowed)."""
    out: dict[tuple[str, ...], Mapping[str, Any]] = {}
    stack: list[tuple[tuple[str, ...], Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, Mapping):
            continue
        if path:
            out[path] = node
        props = node.get("properties")
        if isinstance(props, Mapping):
            stack.extend(((*path, str(k)), v) for k, v in props.items())
    return out


def check_request_headers(pairs: Iterable[tuple[str, str]], body_version: Any, method: str,
                          params: Mapping[str, Any], input_schema: Any = None) -> None:
    """Raise ``HeaderMismatch`` unless the headers mirror the body.

    ``pairs`` are the raw header lines (duplicates visible); ``input_schema`` is the called tool's schema as
    clients see it (``tools/call`` only; ``None`` when the tool is unknown, which the call itself reports).
    """
    folded, duplicated = _fold(pairs)
    for name in sorted(ROUTING_HEADERS & duplicated):
        raise HeaderMismatch(f"{name} header appears more than once")
    version = folded.get(VERSION_HEADER)
    if version is None or version != body_version:
        raise HeaderMismatch("MCP-Protocol-Version header does not match the body's _meta protocol version")
    if folded.get(METHOD_HEADER) != method:
        raise HeaderMismatch("Mcp-Method header does not match the body's method")
    field = NAME_FIELDS.get(method)
    if field is not None:
        value = params.get(field)
        if value is not None and decode_header_value(folded.get(NAME_HEADER)) != value:
            raise HeaderMismatch(f"Mcp-Name header does not match the body's {field!r}")
    if method == TOOLS_CALL and input_schema is not None:
        check_param_headers(input_schema, params.get("arguments") or {}, folded, duplicated)
