"""The 2026-07-28 request-metadata headers bastion writes as a client, as pure functions: what a modern HTTP
request mirrors from its body, and which tools a client must drop for invalid ``x-mcp-header`` annotations.

The rules shared with the server side (header names, valid annotations, the sentinel encoding) are in
``bastion.protocol.headers``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from bastion.protocol.headers import (
    METHOD_HEADER,
    NAME_FIELDS,
    NAME_HEADER,
    PARAM_PREFIX,
    VERSION_HEADER,
    HeaderMap,
    encode_header_value,
    invalid_header_reason,
)
from bastion.protocol.methods import TOOLS_CALL

__all__ = ["encode_header_value", "invalid_header_tools", "param_headers", "request_headers"]

_SAFE_INTEGER = 2**53 - 1


def invalid_header_tools(tools: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Tool name → reason, for every tool whose ``x-mcp-header`` annotations are invalid."""
    invalid: dict[str, str] = {}
    for tool in tools:
        reason = invalid_header_reason(tool.get("inputSchema"))
        if reason is not None:
            invalid[str(tool.get("name"))] = reason
    return invalid


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
    out = {VERSION_HEADER: version, METHOD_HEADER: method}
    field = NAME_FIELDS.get(method)
    if field is not None and params is not None:
        name = params.get(field)
        if isinstance(name, str):
            out[NAME_HEADER] = encode_header_value(name)
    if method == TOOLS_CALL and tool_headers and params is not None:
        out.update(param_headers(tool_headers, params.get("arguments")))
    return out
