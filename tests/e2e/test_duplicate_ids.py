"""A request whose JSON-RPC id another request in flight already has, through a real gateway over raw HTTP.

Session-based revisions (2024-11-05 … 2025-11-25): a session keeps its requests in flight by id, for
``notifications/cancelled``. A second request under an id already in flight took the first's place there: the
cancellation then reached the wrong request (or none, once the second had ended), and the first could never be
cancelled again. Now the second is refused on its own (``-32600``, naming the id, audited when it is a
``tools/call``) and the first runs on, cancellable by its id.

2026-07-28: each request is self-contained and cancelled by closing its own response stream; bastion keys nothing
by a client's id, and cannot tell which requests share a sender (one credential may serve many independent
clients, each counting its ids from 1). Two requests with the same id are served side by side.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.raw_http import RawResponse, build, exchange
from tests.support.rpc import RpcClient

RECORD = "calls.jsonl"
MODERN = "2026-07-28"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("duplicate-ids")
    record = workdir / RECORD
    record.touch()
    g = GatewayProcess({"auth": "none",
                        "upstreams": {"basic": stdio_upstream("tests.fixtures.basic_server", "--record", str(record),
                                                              timeout="30s")}},
                       workdir).start()
    yield g
    g.stop()


def notes(gw: GatewayProcess, tag: str) -> list[dict[str, Any]]:
    return [entry for entry in map(json.loads, (gw.workdir / RECORD).read_text().splitlines())
            if (entry.get("arguments") or {}).get("tag") == tag]


async def until(predicate: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def call(rid: int | str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}


def post(gw: GatewayProcess, body: dict[str, Any], headers: dict[str, str]) -> Any:
    raw = json.dumps(body).encode()
    request = build("POST", "/mcp", [("Host", f"127.0.0.1:{gw.port}"), ("Content-Type", "application/json"),
                                     ("Connection", "close"), *headers.items()], raw)
    return exchange(gw.port, request, timeout=30)


def answer(response: RawResponse) -> dict[str, Any]:
    """The JSON-RPC answer of a plain JSON body or of the last event of an SSE one."""
    if (response.header("content-type") or "").startswith("text/event-stream"):
        data = [line[6:] for line in response.body.decode().splitlines() if line.startswith("data: ")]
        return dict(json.loads(data[-1]))
    return dict(response.json())


def test_a_session_request_reusing_an_id_in_flight_is_refused_and_the_first_stays_cancellable(
        gw: GatewayProcess) -> None:
    client = RpcClient(gw.url)
    try:
        client.initialize()
        assert client.session_id is not None
        headers = {"Accept": "application/json, text/event-stream", "Mcp-Session-Id": client.session_id,
                   "MCP-Protocol-Version": client.version}
        before = len(gw.records("tool.call"))

        async def scenario() -> tuple[RawResponse, RawResponse, RawResponse]:
            first = asyncio.create_task(post(gw, call(5, "basic__slow", {"seconds": 20, "steps": 20,
                                                                         "tag": "first"}), headers))
            await until(lambda: notes(gw, "first"), "the first call never reached the upstream")
            duplicate = await post(gw, call(5, "basic__echo", {"message": "second", "tag": "second"}), headers)
            # The same digits as a string are another id (JSON-RPC compares ids by type and value).
            other = await post(gw, call("5", "basic__echo", {"message": "other", "tag": "other"}), headers)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}
            assert (await post(gw, cancel, headers)).status == 202
            return await first, duplicate, other

        first, duplicate, other = asyncio.run(scenario())
    finally:
        client.close()
    assert duplicate.status == 200
    refused = answer(duplicate)
    assert refused["id"] == 5
    assert refused["error"]["code"] == -32600
    assert refused["error"]["message"] == \
        "Invalid Request: id 5 is already in use by a request in flight in this session"
    assert notes(gw, "second") == []  # never forwarded
    assert answer(other)["result"]["content"][0]["text"] == "other"
    # The cancellation reached the first call, which the duplicate had left alone.
    assert answer(first)["error"]["message"] == "Request cancelled"
    deadline = time.monotonic() + 20
    while not any(n.get("cancelled") == "slow" for n in notes(gw, "first")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(n.get("cancelled") == "slow" for n in notes(gw, "first"))
    records = gw.wait_records("tool.call", before + 3)[before:]
    by_id = {(type(r["request_id"]).__name__, r["outcome"]): r for r in records}
    assert set(by_id) == {("int", "invalid_input"), ("str", "allowed"), ("int", "client_disconnected")}, records
    refusal = by_id[("int", "invalid_input")]
    assert refusal["tool"]["name"] == "basic__echo"
    assert refusal["session"] == client.session_id
    assert refusal["stage"] == "parse"
    assert "already in use" in refusal["reason"]
    assert "Traceback" not in gw.stderr()


def test_two_modern_requests_with_the_same_id_are_served_side_by_side(gw: GatewayProcess) -> None:
    def modern(tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        params = {"name": tool, "arguments": arguments,
                  "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                            "io.modelcontextprotocol/clientCapabilities": {}}}
        headers = {"Accept": "application/json, text/event-stream",
                   **request_headers("tools/call", params, MODERN, None)}
        return {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}, headers

    async def scenario() -> tuple[RawResponse, RawResponse]:
        slow = asyncio.create_task(post(gw, *modern("basic__slow", {"seconds": 1, "steps": 2, "tag": "m-slow"})))
        await until(lambda: notes(gw, "m-slow"), "the first call never reached the upstream")
        quick = await post(gw, *modern("basic__echo", {"message": "quick", "tag": "m-quick"}))
        return await slow, quick

    slow, quick = asyncio.run(scenario())
    assert answer(quick)["id"] == 9
    assert answer(quick)["result"]["content"][0]["text"] == "quick"
    assert answer(slow)["id"] == 9
    assert answer(slow)["result"]["content"][0]["text"] == "done"
