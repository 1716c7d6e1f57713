"""Front-door validation of the 2026-07-28 request-metadata headers against the body."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from bastion.errors import HEADER_MISMATCH
from bastion.server.headers import HeaderMismatch, check_request_headers, decode_header_value

V = "2026-07-28"
SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "region": {"type": "string", "x-mcp-header": "Region"},
    "count": {"type": "integer", "x-mcp-header": "Count"},
    "flag": {"type": "boolean", "x-mcp-header": "Flag"},
    "opts": {"type": "object", "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}}},
    "note": {"type": "string"}}}


def b64(text: str) -> str:
    return "=?base64?" + base64.b64encode(text.encode()).decode() + "?="


def base(method: str = "tools/call", name: str | None = "t") -> list[tuple[str, str]]:
    pairs = [("MCP-Protocol-Version", V), ("Mcp-Method", method)]
    if name is not None:
        pairs.append(("Mcp-Name", name))
    return pairs


def check(pairs: list[tuple[str, str]], params: dict[str, Any], method: str = "tools/call",
          schema: Any = SCHEMA) -> None:
    check_request_headers(pairs, V, method, params, schema)


def refused(pairs: list[tuple[str, str]], params: dict[str, Any], method: str = "tools/call") -> str:
    with pytest.raises(HeaderMismatch) as info:
        check(pairs, params, method)
    assert info.value.code == HEADER_MISMATCH and info.value.http_status == 400
    return info.value.message


def test_matching_headers_pass_and_names_compare_case_insensitively() -> None:
    pairs = [("mcp-protocol-version", V), ("MCP-METHOD", "tools/call"), ("mcp-name", "t"),
             ("mcp-param-region", "eu-west"), ("Mcp-Param-Count", "3"), ("Mcp-Param-Flag", "false"),
             ("Mcp-Param-Zone", "a")]
    check(pairs, {"name": "t", "arguments": {"region": "eu-west", "count": 3, "flag": False, "opts": {"zone": "a"},
                                             "note": "not mirrored"}})


@pytest.mark.parametrize(("pairs", "expected"), [
    ([("Mcp-Method", "tools/list")], "MCP-Protocol-Version"),
    ([("MCP-Protocol-Version", "2025-11-25"), ("Mcp-Method", "tools/list")], "MCP-Protocol-Version"),
    ([("MCP-Protocol-Version", V)], "Mcp-Method"),
    ([("MCP-Protocol-Version", V), ("Mcp-Method", "tools/call")], "Mcp-Method"),
    ([("MCP-Protocol-Version", V), ("Mcp-Method", "tools/list"), ("Mcp-Method", "tools/list")], "more than once"),
])
def test_version_and_method_must_mirror_the_body(pairs: list[tuple[str, str]], expected: str) -> None:
    assert expected in refused(pairs, {}, method="tools/list")


def test_name_is_required_for_named_methods_and_decoded_from_base64() -> None:
    assert "Mcp-Name" in refused(base(name=None), {"name": "t"})
    assert "Mcp-Name" in refused(base(name="other"), {"name": "t"})
    check_request_headers(base("resources/read", b64("memo://é")), V, "resources/read", {"uri": "memo://é"})
    check_request_headers(base("prompts/get", "greet"), V, "prompts/get", {"name": "greet"})
    with pytest.raises(HeaderMismatch):
        check_request_headers(base("prompts/get", "=?base64?!!?="), V, "prompts/get", {"name": "greet"})


def test_param_header_missing_present_without_value_or_different_is_refused() -> None:
    assert "missing" in refused(base(), {"name": "t", "arguments": {"region": "eu"}})
    assert "no value" in refused([*base(), ("Mcp-Param-Region", "eu")], {"name": "t", "arguments": {}})
    assert "does not match" in refused([*base(), ("Mcp-Param-Region", "us")],
                                       {"name": "t", "arguments": {"region": "eu"}})
    assert "more than once" in refused([*base(), ("Mcp-Param-Region", "eu"), ("Mcp-Param-Region", "eu")],
                                       {"name": "t", "arguments": {"region": "eu"}})
    assert "malformed" in refused([*base(), ("Mcp-Param-Region", "=?base64?%%?=")],
                                  {"name": "t", "arguments": {"region": "eu"}})


def test_integers_compare_numerically_and_values_decode() -> None:
    check([*base(), ("Mcp-Param-Count", "42.0")], {"name": "t", "arguments": {"count": 42}})
    check([*base(), ("Mcp-Param-Count", "42")], {"name": "t", "arguments": {"count": 42.0}})
    half = [*base(), ("Mcp-Param-Count", "42.5")]
    assert "does not match" in refused(half, {"name": "t", "arguments": {"count": 42}})
    check([*base(), ("Mcp-Param-Region", b64(" spaced ü "))], {"name": "t", "arguments": {"region": " spaced ü "}})


def test_null_arguments_are_absent_and_unknown_param_headers_are_ignored() -> None:
    check([*base(), ("Mcp-Param-Unknown", "x")], {"name": "t", "arguments": {"region": None}})


def test_without_a_schema_only_routing_headers_are_checked() -> None:
    check([*base(), ("Mcp-Param-Region", "anything")], {"name": "t", "arguments": {}}, schema=None)


def test_invalid_annotations_validate_nothing() -> None:
    bad = {"type": "object", "properties": {"ratio": {"type": "number", "x-mcp-header": "Ratio"}}}
    check(base(), {"name": "t", "arguments": {"ratio": 1.5}}, schema=bad)


def test_decode_header_value() -> None:
    assert decode_header_value(None) is None
    assert decode_header_value("plain") == "plain"
    assert decode_header_value(b64("日本")) == "日本"
    assert decode_header_value("=?base64?aGk?=") is None  # non-canonical (missing padding)
    assert decode_header_value("=?base64?" + base64.b64encode(b"\xff").decode() + "?=") is None
