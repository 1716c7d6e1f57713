"""The 2026-07-28 wire rules as pure functions: envelope, result types, era verdicts, header mirroring and
``x-mcp-header`` validation."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from bastion.errors import INTERNAL_ERROR
from bastion.upstream.headers import encode_header_value, invalid_header_tools, param_headers, request_headers
from bastion.upstream.modern import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    PROTOCOL_VERSION_KEY,
    UnknownResultType,
    check_result,
    envelope,
    error_verdict,
    http_probe_verdict,
    parse_discover_result,
)
from bastion.upstream.modern_client import ModernCalls


def tool(name: str, properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object", "properties": properties, **extra}}


def test_envelope_keeps_the_callers_meta_but_not_its_identity() -> None:
    params = envelope({"name": "t", "_meta": {"progressToken": 7, PROTOCOL_VERSION_KEY: "1999-01-01",
                                              CLIENT_INFO_KEY: {"name": "someone"}}}, "0.1.0")
    meta = params["_meta"]
    assert params["name"] == "t"
    assert meta["progressToken"] == 7
    assert meta[PROTOCOL_VERSION_KEY] == "2026-07-28"
    assert meta[CLIENT_INFO_KEY] == {"name": "bastion", "version": "0.1.0"}
    assert meta[CLIENT_CAPABILITIES_KEY] == {}


def test_envelope_relays_capabilities_only_when_the_caller_passes_them() -> None:
    relayed = envelope({"_meta": {CLIENT_CAPABILITIES_KEY: {"elicitation": {}}}}, "1")
    assert relayed["_meta"][CLIENT_CAPABILITIES_KEY] == {"elicitation": {}}
    assert envelope(None, "1")["_meta"][CLIENT_CAPABILITIES_KEY] == {}


def test_result_types() -> None:
    assert check_result("u", {"content": []}) == {"content": []}
    mrtr = {"resultType": "input_required", "requestState": "opaque=="}
    assert check_result("u", mrtr) is mrtr
    with pytest.raises(UnknownResultType) as info:
        check_result("u", {"resultType": "task"})
    assert info.value.code == INTERNAL_ERROR
    assert "unknown type" in info.value.message


@pytest.mark.parametrize(("status", "body", "verdict"), [
    (200, {"result": {"supportedVersions": ["2026-07-28"], "capabilities": {}}}, "modern"),
    (200, {"result": {"supportedVersions": ["2025-11-25"]}}, "legacy"),
    (200, {"error": {"code": -32601, "message": "Method not found"}}, "legacy"),
    (400, {"error": {"code": -32600, "message": "Bad Request: Missing session ID"}}, "legacy"),
    (400, None, "legacy"),
    (405, None, "legacy"),
    (404, {"error": {"code": -32601, "message": "Method not found"}}, "modern"),
    (400, {"error": {"code": -32020, "message": "header mismatch"}}, "modern"),
    (400, {"error": {"code": -32021, "message": "capability"}}, "modern"),
    (400, {"error": {"code": -32022, "data": {"supported": ["2026-07-28", "2027-01-01"]}}}, "modern"),
    (400, {"error": {"code": -32022, "data": {"supported": ["2025-06-18", "2025-11-25"]}}}, "legacy"),
    (400, {"error": {"code": -32022, "data": {"supported": ["2027-01-01"]}}}, "unsupported"),
    (401, None, "unsupported"),
    (500, {"error": {"code": -32603}}, "unsupported"),
])
def test_http_probe_verdicts(status: int, body: Any, verdict: str) -> None:
    assert http_probe_verdict(status, body) == verdict


def test_a_probe_error_is_never_keyed_to_one_code() -> None:
    for code in (-32600, -32601, -32602, -32603, -32000, 1):
        assert error_verdict({"code": code, "message": "no"}) == "legacy"


def test_discover_result_becomes_info() -> None:
    info = parse_discover_result("u", {
        "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {"listChanged": True}},
        "instructions": "hi", "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "s", "version": "1"}}})
    assert (info.era, info.protocol_version, info.instructions) == ("modern", "2026-07-28", "hi")
    assert info.server_info == {"name": "s", "version": "1"}
    assert info.capabilities == {"tools": {"listChanged": True}}


@pytest.mark.parametrize(("value", "wire"), [
    ("eu-west-1", "eu-west-1"),
    ("two words", "two words"),
    (" padded", "=?base64?" + base64.b64encode(b" padded").decode() + "?="),
    ("Zürich", "=?base64?" + base64.b64encode("Zürich".encode()).decode() + "?="),
    ("line\nbreak", "=?base64?" + base64.b64encode(b"line\nbreak").decode() + "?="),
    ("=?base64?abc?=", "=?base64?" + base64.b64encode(b"=?base64?abc?=").decode() + "?="),
])
def test_header_values(value: str, wire: str) -> None:
    assert encode_header_value(value) == wire


def test_request_headers_mirror_the_body() -> None:
    mapping = {("region",): "Region", ("flag",): "Flag", ("n",): "N", ("nested", "id"): "Id"}
    headers = request_headers("tools/call", {"name": "do it", "arguments": {
        "region": "eu", "flag": False, "n": 42, "nested": {"id": "x"}, "other": "y"}}, "2026-07-28", mapping)
    assert headers == {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "do it",
                       "Mcp-Param-Region": "eu", "Mcp-Param-Flag": "false", "Mcp-Param-N": "42",
                       "Mcp-Param-Id": "x"}
    assert request_headers("resources/read", {"uri": "memo://ü"}, "v")["Mcp-Name"].startswith("=?base64?")
    assert "Mcp-Name" not in request_headers("tools/list", {"name": "x"}, "v")


def test_absent_and_null_arguments_send_no_header() -> None:
    assert param_headers({("a",): "A", ("b",): "B"}, {"b": None}) == {}
    assert param_headers({("a",): "A"}, None) == {}


@pytest.mark.parametrize(("schema_tool", "reason"), [
    (tool("t", {"r": {"type": "number", "x-mcp-header": "R"}}), "string, integer and boolean"),
    (tool("t", {"r": {"type": "string", "x-mcp-header": ""}}), "HTTP token"),
    (tool("t", {"r": {"type": "string", "x-mcp-header": "Has Space"}}), "HTTP token"),
    (tool("t", {"r": {"type": "string", "x-mcp-header": 5}}), "HTTP token"),
    (tool("t", {"a": {"type": "string", "x-mcp-header": "Dup"}, "b": {"type": "string", "x-mcp-header": "dup"}}),
     "duplicates"),
    (tool("t", {"list": {"type": "array", "items": {"type": "string", "x-mcp-header": "Item"}}}), "reachable"),
    (tool("t", {}, anyOf=[{"properties": {"x": {"type": "string", "x-mcp-header": "X"}}}]), "reachable"),
    ({"name": "t", "inputSchema": {"type": "object", "x-mcp-header": "Root"}}, "reachable"),
])
def test_invalid_annotations(schema_tool: dict[str, Any], reason: str) -> None:
    found = invalid_header_tools([schema_tool])
    assert list(found) == ["t"]
    assert reason in found["t"]


def test_valid_annotations_pass() -> None:
    tools = [tool("a", {"r": {"type": "string", "x-mcp-header": "Region"},
                        "n": {"type": "integer", "x-mcp-header": "N"},
                        "o": {"type": "object", "properties": {"f": {"type": "boolean", "x-mcp-header": "F"}}}}),
             tool("b", {"plain": {"type": "number"}}), {"name": "c"}]
    assert invalid_header_tools(tools) == {}


def test_tools_list_results_are_filtered_and_indexed_across_pages() -> None:
    calls = ModernCalls("u")
    good = tool("good", {"r": {"type": "string", "x-mcp-header": "Region"}})
    bad = tool("bad", {"r": {"type": "number", "x-mcp-header": "R"}})
    later = tool("later", {"k": {"type": "string", "x-mcp-header": "Key"}})
    first = calls.result("tools/list", None, {"tools": [good, bad], "nextCursor": "2"})
    assert [t["name"] for t in first["tools"]] == ["good"]
    second = calls.result("tools/list", {"cursor": "2"}, {"tools": [later]})
    assert [t["name"] for t in second["tools"]] == ["later"]
    assert calls.tool_headers("good") == {("r",): "Region"}
    assert calls.tool_headers("later") == {("k",): "Key"}
    assert calls.tool_headers("bad") is None
    # A new listing replaces the index once complete.
    calls.result("tools/list", None, {"tools": [later]})
    assert calls.tool_headers("good") is None
