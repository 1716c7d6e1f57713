"""Every error the front door gives at the JSON-RPC layer: code, message, id and HTTP status, per era.

One table (docs/errors.md has the same one for readers). The id rule under test: a response carries the request's
id whenever it could be read, and ``null`` only when it could not (not JSON, not an object, an invalid id, or a
body nested past what any parser here reads). Runs in-process against the real app and a real upstream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.inprocess import MODERN_META, FrontDoor, front_door
from tests.support.rpc import parse_body

pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes | Any
    code: int
    message: str
    rid: Any
    status: int
    era: str = "legacy"  # legacy: inside a 2025-11-25 session; "none": no session header; modern: stateless
    headers: dict[str, str] = field(default_factory=dict)
    audited: bool = False  # a tools/call: it must leave exactly one tool.call record


def req(rid: Any, method: str = "ping", params: Any = None, **extra: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method, **extra}
    if params is not None:
        msg["params"] = params
    return msg


def modern(rid: Any, method: str, params: dict[str, Any] | None = None, meta: Any = None) -> dict[str, Any]:
    return req(rid, method, {**(params or {}), "_meta": MODERN_META if meta is None else meta})


def deep(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def call(rid: Any, arguments: Any) -> dict[str, Any]:
    return req(rid, "tools/call", {"name": "basic__echo", "arguments": arguments})


def raw(text: str) -> bytes:
    return text.encode()


CASES = [
    # -- not JSON, not a message: the id cannot be read -----------------------------------------------------
    Case("not JSON", b"{", -32700, "Parse error", None, 400),
    Case("not UTF-8", b'{"jsonrpc":"2.0","id":1,"method":"\xff"}', -32700, "Parse error", None, 400),
    Case("NaN is not JSON", raw('{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":NaN}}'), -32700,
         "Parse error", None, 400),
    Case("a scalar", b"5", -32600, "must be an object", None, 400),
    Case("too deep and too large to read", b'{"jsonrpc":"2.0","id":1,"params":' + b"[" * 30_000 + b"]" * 30_000
         + b"}", -32600, "nested deeper than 64 levels", None, 400),
    # -- the id itself is invalid: null, as JSON-RPC says ---------------------------------------------------
    Case("id null", req(None), -32600, "id must be a string or an integer", None, 400),
    Case("id boolean", req(True), -32600, "id must be", None, 400),
    Case("id fractional", req(1.5), -32600, "id must be", None, 400),
    Case("id beyond 2^53-1", raw('{"jsonrpc":"2.0","id":9007199254740993,"method":"ping"}'), -32600,
         "id must be", None, 400),
    Case("id with a lone surrogate", raw('{"jsonrpc":"2.0","id":"a\\ud800","method":"ping"}'), -32600,
         "id must be", None, 400),
    # -- the envelope is wrong but the id is readable: it is echoed -----------------------------------------
    Case("jsonrpc missing", {"id": 7, "method": "ping"}, -32600, '"jsonrpc" must be "2.0"', 7, 400),
    Case("method empty", req("m1", ""), -32600, "method must be a non-empty string", "m1", 400),
    Case("method not a string", req(8, 5), -32600, "method must be a non-empty string", 8, 400),
    Case("method with a lone surrogate", raw('{"jsonrpc":"2.0","id":9,"method":"to\\udc00ls/list"}'), -32600,
         "lone UTF-16 surrogate at method", 9, 400),
    Case("neither request nor response", {"jsonrpc": "2.0", "id": 10}, -32600, "neither a request", 10, 400),
    Case("result and error together", {"jsonrpc": "2.0", "id": 11, "result": {}, "error": {}}, -32600,
         "neither a request", 11, 400),
    # -- params the gateway cannot accept: -32602 with the id ------------------------------------------------
    Case("params an array", req(12, "tools/list", [1]), -32602, "params must be an object", 12, 400),
    Case("arguments too deep", call(13, deep(80)), -32602, "nesting deeper than 64 levels at params.arguments",
         13, 400, audited=True),
    Case("arguments deeper than any parser reads", raw('{"jsonrpc":"2.0","id":"deep","method":"tools/call","params":'
                                                       '{"name":"basic__echo","arguments":{"a":' + "[" * 3000
                                                       + "]" * 3000 + "}}}"),
         -32602, "nesting deeper than 64 levels at params.arguments.a[0]", "deep", 400, audited=True),
    Case("integer beyond 2^53-1", raw('{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":'
                                      '"basic__echo","arguments":{"n":9007199254740993}}}'), -32602,
         "outside the JSON-safe range ±(2^53-1) at params.arguments.n", 14, 400, audited=True),
    Case("integer beyond 64 bits", raw('{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":'
                                       '"basic__echo","arguments":{"n":[123456789012345678901234567890]}}}'),
         -32602, "at params.arguments.n[0]", 15, 400, audited=True),
    Case("lone surrogate in arguments", raw('{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":'
                                            '"basic__echo","arguments":{"message":"\\ud83d"}}}'), -32602,
         "lone UTF-16 surrogate at params.arguments.message", "s", 400, audited=True),
    Case("double overflow", raw('{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"basic__echo",'
                                '"arguments":{"x":1e999}}}'), -32602, "too large for a double", 16, 400,
         audited=True),
    Case("tools/call without a name", req(17, "tools/call", {"arguments": {}}), -32602,
         "requires a string 'name'", 17, 200, audited=True),
    Case("tools/call arguments not an object", req(18, "tools/call", {"name": "basic__echo", "arguments": [1]}),
         -32602, "'arguments' must be an object", 18, 200, audited=True),
    Case("unknown tool", call(19, {}) | {"params": {"name": "nope__x", "arguments": {}}}, -32602,
         "Unknown tool: nope__x", 19, 200, audited=True),
    # -- method and session rules, legacy era -----------------------------------------------------------------
    Case("unknown method (legacy)", req(20, "no/such"), -32601, "Method not found: no/such", 20, 200),
    Case("server/discover is modern-only", req(21, "server/discover"), -32601, "Method not found", 21, 200),
    Case("no session, no _meta", req(22, "tools/list"), -32602, "Missing Mcp-Session-Id", 22, 400, era="none"),
    Case("unknown session", req(23, "tools/list"), -32600, "Session not found", None, 404, era="none",
         headers={"Mcp-Session-Id": "nope"}),
    # -- modern (2026-07-28) ---------------------------------------------------------------------------------
    Case("unknown method (modern)", modern(30, "no/such"), -32601, "Method not found: no/such", 30, 404,
         era="modern"),
    Case("legacy-only method (modern)", modern(31, "ping"), -32601, "Method not found: ping", 31, 404,
         era="modern"),
    Case("capabilities missing", modern(32, "tools/list", meta={"io.modelcontextprotocol/protocolVersion":
                                                                 "2026-07-28"}),
         -32602, "Missing required _meta field", 32, 400, era="modern"),
    Case("unsupported version", modern(33, "tools/list", meta={**MODERN_META,
                                                               "io.modelcontextprotocol/protocolVersion": "1999"}),
         -32022, "Unsupported protocol version: 1999", 33, 400, era="modern"),
    Case("header does not match the body", modern(34, "tools/list"), -32020, "Mcp-Method", 34, 400, era="modern",
         headers={"Mcp-Method": "prompts/list"}),
    Case("invalid log level", modern(35, "tools/list", meta={**MODERN_META,
                                                             "io.modelcontextprotocol/logLevel": "loud"}),
         -32602, "Invalid log level", 35, 400, era="modern"),
    Case("arguments too deep (modern)", modern(36, "tools/call", {"name": "basic__echo", "arguments": deep(70)}),
         -32602, "nesting deeper than 64 levels", 36, 400, era="modern", audited=True),
    # -- batches: only inside 2025-03-26 sessions ------------------------------------------------------------
    Case("batch in a 2025-11-25 session", [req(40)], -32600, "batches are only allowed in 2025-03-26", None, 400),
    Case("batch without a session", [req(41)], -32600, "batches are only allowed in 2025-03-26", None, 400,
         era="none"),
    Case("batch in a modern request", [modern(42, "tools/list")], -32600, "batches are only allowed", None, 400,
         era="none"),
    Case("empty batch", [], -32600, "empty batch", None, 400, era="2025-03-26"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def door(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FrontDoor]:
    async with front_door(tmp_path_factory.mktemp("errors")) as fd:
        yield fd


async def _headers(door: FrontDoor, era: str) -> dict[str, str]:
    if era in ("legacy", "2025-03-26"):
        return await door.session("2025-11-25" if era == "legacy" else era)
    return {}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_front_door_error(door: FrontDoor, case: Case) -> None:
    headers = {**await _headers(door, case.era), **case.headers}
    if case.era == "modern" and isinstance(case.body, dict):
        method = case.body.get("method")
        version = case.body["params"]["_meta"].get("io.modelcontextprotocol/protocolVersion")
        headers.setdefault("Mcp-Method", method if isinstance(method, str) else "")
        headers.setdefault("MCP-Protocol-Version", str(version))
    before = len(door.records())
    r = await door.post(case.body, headers)
    assert r.status_code == case.status, r.text
    [body] = parse_body(r)  # legacy sessions that accept SSE get a one-event stream
    assert body["jsonrpc"] == "2.0"
    assert body["id"] == case.rid
    assert body["error"]["code"] == case.code
    assert case.message in body["error"]["message"]
    records = door.records()[before:]
    if case.audited:
        assert len(records) == 1, records
        assert records[0]["request_id"] == case.rid
        assert records[0]["decision"] == "deny"
        assert records[0]["error"]["code"] == case.code
        assert records[0]["tool"]["name"] in ("basic__echo", "nope__x", "")
        if case.name == "arguments deeper than any parser reads":
            assert "cut at the depth limit" in records[0]["audit_error"]
    else:
        assert records == []


async def test_batch_items_answer_with_their_own_ids(door: FrontDoor) -> None:
    """Inside a 2025-03-26 session, each item is judged alone; its error carries its id when readable."""
    headers = await door.session("2025-03-26")
    body = ('[{"jsonrpc":"2.0","id":1,"method":"ping"},'
            '{"jsonrpc":"2.0","id":2,"method":"initialize","params":{}},'
            '{"jsonrpc":"2.0","id":3,"method":""},'
            '{"jsonrpc":"2.0","id":null,"method":"ping"},'
            '{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"basic__echo","arguments":{"n":'
            '9007199254740993}}},'
            '{"jsonrpc":"2.0","method":"notifications/progress","params":{}},'
            '5]')
    before = len(door.records())
    r = await door.post(body.encode(), headers)
    assert r.status_code == 200, r.text
    items = parse_body(r)
    answers = {json.dumps(a["id"]): a for a in items}
    assert answers["1"]["result"] == {}
    assert (answers["2"]["error"]["code"], answers["3"]["error"]["code"]) == (-32600, -32600)
    assert answers["4"]["error"]["code"] == -32602
    assert len(items) == 6  # the notification gets no answer; the null-id and the scalar items do
    assert [a["error"]["code"] for a in items if a["id"] is None] == [-32600, -32600]
    records = door.records()[before:]
    assert [(d["request_id"], d["stage"]) for d in records] == [(4, "parse")]


async def test_the_depth_limit_is_configurable(tmp_path: Path) -> None:
    async with front_door(tmp_path, listen={"max_json_depth": 8}) as fd:
        headers = await fd.session()
        ok = await fd.post(call(1, deep(4)) | {"params": {"name": "basic__echo",
                                                          "arguments": {"message": "hi", "d": deep(3)}}}, headers)
        assert ok.status_code == 200
        assert parse_body(ok)[0]["result"]["content"][0]["text"] == "hi"
        refused = await fd.post(call(2, {"message": "hi", "d": deep(6)}), headers)
        assert refused.status_code == 400
        assert refused.json()["error"] == {"code": -32602, "message": "Invalid params: nesting deeper than 8 "
                                           "levels at params.arguments.d.a.a.a.a.a"}


async def test_a_refused_name_is_recorded_encodable_and_metrics_still_render(door: FrontDoor) -> None:
    headers = await door.session()
    before = len(door.records())
    r = await door.post(raw('{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"ev\\ud800il",'
                            '"arguments":{}}}'), headers)
    [answer] = parse_body(r)
    assert (r.status_code, answer["id"], answer["error"]["code"]) == (400, 50, -32602)
    [record] = door.records()[before:]
    assert record["tool"]["name"] == "ev\ufffdil"
    metrics = await door.client.get("/metrics")
    assert metrics.status_code == 200
    assert 'tool="ev\ufffdil"' in metrics.text
