"""A tools/call the front door refuses after reading it, before the dispatcher sees it, still has its one record.

The refusals between "this is a tools/call" and the dispatcher: the 2026-07-28 envelope and headers (missing
client capabilities, a routing header that disagrees with the body, an unsupported version, an invalid log
level), a request in neither era's shape, and the session checks (unknown, another principal's, a batch refused
whole). Each call here carries arguments of its own, so its record is found by their digest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion.audit.record import arguments_digest
from bastion.auth.apikeys import hash_key
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT, RpcClient

ALICE = "bst_alice_" + "r" * 40
BOB = "bst_bob_" + "s" * 40
V = "2026-07-28"
POLICY = """\
version: 1
rules:
  - id: alice-all
    effect: allow
    principals: {ids: [alice]}
    upstreams: [basic]
  - id: bob-echo
    effect: allow
    principals: {ids: [bob]}
    tools: [basic__echo]
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("refusals")
    (workdir / "policies").mkdir()
    (workdir / "policies" / "p.yaml").write_text(POLICY)
    gw = GatewayProcess({
        "auth": {"api_keys": [{"id": "alice", "hash": hash_key(ALICE)}, {"id": "bob", "hash": hash_key(BOB)}]},
        "upstreams": {"basic": stdio_upstream()},
        "policies": str(workdir / "policies"),
        "audit": {"sinks": [{"file": str(workdir / "audit.jsonl")}]},
    }, workdir).start()
    yield gw
    gw.stop()


def call_body(arguments: dict[str, Any], meta: dict[str, Any] | None, rid: int = 1) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "basic__echo", "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


def modern_meta(**extra: Any) -> dict[str, Any]:
    return {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}, **extra}


def post(gw: GatewayProcess, body: Any, headers: dict[str, str], key: str = ALICE) -> httpx.Response:
    base = {"Authorization": f"Bearer {key}", "Accept": ACCEPT, "Content-Type": "application/json"}
    return httpx.post(gw.url, content=json.dumps(body), headers={**base, **headers}, timeout=10)


def routing(name: str = "basic__echo", version: str = V) -> dict[str, str]:
    return {"MCP-Protocol-Version": version, "Mcp-Method": "tools/call", "Mcp-Name": name}


def records_for(gw: GatewayProcess, arguments: dict[str, Any], expected: int = 1) -> list[dict[str, Any]]:
    path = gw.workdir / "audit.jsonl"
    digest = arguments_digest(arguments)
    found: list[dict[str, Any]] = []
    for _ in range(100):
        found = [r for r in map(json.loads, path.read_text().splitlines())
                 if r["event"] == "tool.call" and r["arguments_digest"] == digest]
        if len(found) >= expected:
            break
        time.sleep(0.05)
    time.sleep(0.1)  # a second record, were there one, would be written by now
    return [r for r in map(json.loads, path.read_text().splitlines())
            if r["event"] == "tool.call" and r["arguments_digest"] == digest]


def assert_one_refusal_record(gw: GatewayProcess, arguments: dict[str, Any], response: httpx.Response,
                              era: str) -> dict[str, Any]:
    records = records_for(gw, arguments)
    assert len(records) == 1, (arguments, response.status_code, response.text, records)
    record = records[0]
    assert (record["decision"], record["outcome"], record["stage"]) == ("deny", "invalid_input", "parse")
    assert record["principal"]["id"] == "alice"
    assert record["era"] == era
    assert record["tool"]["name"] == "basic__echo"
    error = response.json()["error"]
    assert record["error"]["code"] == error["code"]
    return record


@pytest.mark.parametrize(("case", "meta", "headers", "status", "code"), [
    ("no client capabilities", {"io.modelcontextprotocol/protocolVersion": V}, routing(), 400, -32602),
    ("Mcp-Name disagrees", modern_meta(), routing(name="basic__add"), 400, -32020),
    ("Mcp-Name missing", modern_meta(), {"MCP-Protocol-Version": V, "Mcp-Method": "tools/call"}, 400, -32020),
    ("unsupported version", {**modern_meta(), "io.modelcontextprotocol/protocolVersion": "2099-01-01"},
     routing(version="2099-01-01"), 400, -32022),
    ("invalid log level", modern_meta(**{"io.modelcontextprotocol/logLevel": "loud"}), routing(), 400, -32602),
])
def test_a_modern_call_refused_at_its_envelope_has_one_record(
        gw: GatewayProcess, case: str, meta: dict[str, Any], headers: dict[str, str], status: int, code: int) -> None:
    arguments = {"message": f"modern refusal: {case}"}
    response = post(gw, call_body(arguments, meta), headers)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert_one_refusal_record(gw, arguments, response, "modern")


def test_a_call_in_neither_eras_shape_has_one_record(gw: GatewayProcess) -> None:
    arguments = {"message": "no session, no _meta"}
    response = post(gw, call_body(arguments, None), {})
    assert response.status_code == 400
    assert_one_refusal_record(gw, arguments, response, "legacy")


def test_a_call_in_an_unknown_or_foreign_session_has_one_record(gw: GatewayProcess) -> None:
    bobs = RpcClient(gw.url, {"Authorization": f"Bearer {BOB}"})
    try:
        bobs.initialize()
        assert bobs.session_id is not None
        for case, sid in (("unknown session", "no-such-session"), ("bob's session", bobs.session_id)):
            arguments = {"message": f"legacy refusal: {case}"}
            response = post(gw, call_body(arguments, None), {"Mcp-Session-Id": sid,
                                                             "MCP-Protocol-Version": "2025-11-25"})
            assert response.status_code == 404, response.text
            record = assert_one_refusal_record(gw, arguments, response, "legacy")
            assert "session" not in record or record["session"] is None or record["session"].get("id") != sid
    finally:
        bobs.close()


def test_every_call_of_a_batch_refused_whole_has_one_record(gw: GatewayProcess) -> None:
    client = RpcClient(gw.url, {"Authorization": f"Bearer {ALICE}"})
    try:
        client.initialize()  # 2025-11-25: batches are refused
        assert client.session_id is not None
        batch = [call_body({"message": f"batched {i}"}, None, rid=i) for i in range(3)]
        batch.append({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})
        response = post(gw, batch, {"Mcp-Session-Id": client.session_id, "MCP-Protocol-Version": "2025-11-25"})
        assert response.status_code == 400, response.text
        for i in range(3):
            records = records_for(gw, {"message": f"batched {i}"})
            assert len(records) == 1, (i, records)
            assert (records[0]["outcome"], records[0]["stage"]) == ("invalid_input", "parse")
    finally:
        client.close()


def test_a_refused_request_that_is_not_a_call_writes_no_call_record(gw: GatewayProcess) -> None:
    path = gw.workdir / "audit.jsonl"
    before = sum(1 for r in map(json.loads, path.read_text().splitlines()) if r["event"] == "tool.call")
    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/list",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": V}}}
    response = post(gw, body, {"MCP-Protocol-Version": V, "Mcp-Method": "tools/list"})
    assert response.status_code == 400
    time.sleep(0.2)
    after = sum(1 for r in map(json.loads, path.read_text().splitlines()) if r["event"] == "tool.call")
    assert after == before


@pytest.mark.parametrize("modern", [True, False])
def test_a_request_state_for_a_hidden_tool_answers_as_for_an_unknown_one(gw: GatewayProcess, modern: bool) -> None:
    """The requestState check needs the tool's upstream; run before the policy, it told bob which hidden tools
    exist. Now a hidden tool and an unknown one get the same answer, and each call one denied record."""
    client = None if modern else RpcClient(gw.url, {"Authorization": f"Bearer {BOB}"})
    answers = {}
    try:
        if client is not None:
            client.initialize()
        for tool in ("basic__add", "basic__no_such_tool"):
            arguments = {"probe": f"{tool} {modern}"}
            body = call_body(arguments, modern_meta() if modern else None)
            body["params"] = {**body["params"], "name": tool, "requestState": "bastion.rs1.forged"}
            headers = routing(name=tool) if modern else {"Mcp-Session-Id": str(client and client.session_id),
                                                          "MCP-Protocol-Version": "2025-11-25"}
            response = post(gw, body, headers, key=BOB)
            answers[tool] = (response.status_code, json.dumps(response.json().get("error")).replace(tool, "T"))
            records = records_for(gw, arguments)
            assert len(records) == 1, records
            assert (records[0]["decision"], records[0]["outcome"]) == ("deny", "denied")
    finally:
        if client is not None:
            client.close()
    assert answers["basic__add"] == answers["basic__no_such_tool"]
    assert "Unknown tool" in answers["basic__add"][1]


def test_a_forged_request_state_for_a_visible_tool_is_refused_and_recorded_as_denied(gw: GatewayProcess) -> None:
    arguments = {"message": "forged state"}
    body = call_body(arguments, modern_meta())
    body["params"] = {**body["params"], "requestState": "bastion.rs1.forged"}
    response = post(gw, body, routing(), key=BOB)
    assert response.status_code == 400
    assert "Invalid requestState" in response.json()["error"]["message"]
    records = records_for(gw, arguments)
    assert len(records) == 1
    assert (records[0]["decision"], records[0]["outcome"], records[0]["stage"]) == ("deny", "denied", "resolve")
