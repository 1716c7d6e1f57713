"""A client that hangs up before its answer: a cancellation in the 2026-07-28 revision, not in the session-based
ones (docs/protocol.md, "Cancellation").

The clients here are raw sockets that send one request and close the connection a moment later, before bastion
has answered: whether the answer would have been plain JSON or a stream, nothing of it has left yet. The upstream
(``basic_server --record``) notes every request it sees cancelled, so the tests can tell a cancellation that
reached it from a call that merely finished.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.raw_http import build
from tests.support.rpc import ACCEPT, RpcClient

V = "2026-07-28"
SLEEP_S = 3.0
HANG_UP_AFTER_S = 0.5


# The fixture upstream's record of what it was asked and told (``--record``), in the gateway's work directory.
RECORD = "calls.jsonl"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("disconnect")
    record = workdir / RECORD
    record.touch()
    g = GatewayProcess({"auth": "none",
                        "upstreams": {"basic": stdio_upstream("tests.fixtures.basic_server", "--record", str(record))}},
                       workdir).start()
    yield g
    g.stop()


def hang_up(gw: GatewayProcess, body: dict[str, Any], headers: dict[str, str], *, abrupt: bool = True) -> None:
    """Send ``body`` and close the connection ``HANG_UP_AFTER_S`` later, asserting nothing came back by then:
    with a reset (``abrupt``) or an orderly close."""
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(build("POST", "/mcp", [("Host", f"127.0.0.1:{gw.port}"), ("Content-Type", "application/json"),
                                            *headers.items()], raw))
        sock.settimeout(HANG_UP_AFTER_S)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # not a byte of the answer yet
        if abrupt:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x00" * 8)  # struct linger {0, 0}: a reset


def modern(method: str, params: dict[str, Any], accept: str, rid: int) -> tuple[dict[str, Any], dict[str, str]]:
    params = {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": V,
                                  "io.modelcontextprotocol/clientCapabilities": {}}}
    headers = {"Accept": accept, **request_headers(method, params, V, None)}
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}, headers


def upstream_notes(gw: GatewayProcess, tag: str) -> list[dict[str, Any]]:
    record = gw.workdir / RECORD
    return [entry for entry in map(json.loads, record.read_text().splitlines())
            if (entry.get("arguments") or {}).get("tag") == tag]


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("abrupt", [True, False], ids=["reset", "closed"])
@pytest.mark.parametrize("accept", [ACCEPT, "application/json"], ids=["sse-accepting", "json-only"])
def test_a_modern_call_whose_client_hangs_up_before_the_answer_is_cancelled(gw: GatewayProcess, accept: str,
                                                                            abrupt: bool) -> None:
    tag = f"modern-call-{len(accept)}-{abrupt}"
    before = len(gw.records("tool.call"))
    body, headers = modern("tools/call", {"name": "basic__slow",
                                          "arguments": {"seconds": SLEEP_S, "steps": 3, "tag": tag}}, accept, 7)
    started = time.monotonic()
    hang_up(gw, body, headers, abrupt=abrupt)
    records = gw.wait_records("tool.call", before + 1, timeout=SLEEP_S + 10)[before:]
    assert len(records) == 1
    record = records[0]
    assert record["outcome"] == "client_disconnected", record
    assert record["latency_ms"]["upstream"] < SLEEP_S * 1000 / 2
    # The upstream was told (notifications/cancelled) and stopped: it noted the cancellation, well before the
    # call would have ended.
    wait_for(lambda: any("cancelled" in e for e in upstream_notes(gw, tag)))
    assert any(e.get("cancelled") == "slow" for e in upstream_notes(gw, tag))
    assert time.monotonic() - started < SLEEP_S
    assert "Traceback" not in gw.stderr()
    assert "Exception in ASGI application" not in gw.stderr()


def test_any_modern_request_whose_client_hangs_up_is_cancelled(gw: GatewayProcess) -> None:
    tag = "modern-prompt"
    body, headers = modern("prompts/get", {"name": "basic__greet",
                                           "arguments": {"language": "french", "sleep": str(SLEEP_S), "tag": tag}},
                           ACCEPT, 8)
    started = time.monotonic()
    hang_up(gw, body, headers)
    wait_for(lambda: any("cancelled" in e for e in upstream_notes(gw, tag)))
    assert [e.get("cancelled") for e in upstream_notes(gw, tag)] == ["greet"]
    assert time.monotonic() - started < SLEEP_S
    assert "Traceback" not in gw.stderr()


@pytest.mark.parametrize("accept", [ACCEPT, "application/json"], ids=["sse-accepting", "json-only"])
def test_a_legacy_call_whose_client_hangs_up_runs_to_completion(gw: GatewayProcess, accept: str) -> None:
    tag = f"legacy-call-{len(accept)}"
    client = RpcClient(gw.url)
    try:
        client.initialize()
        assert client.session_id is not None
        before = len(gw.records("tool.call"))
        body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"name": "basic__slow", "arguments": {"seconds": 1.5, "steps": 3, "tag": tag}}}
        hang_up(gw, body, {"Accept": accept, "Mcp-Session-Id": client.session_id,
                           "MCP-Protocol-Version": client.version})
        # A dropped connection is not a cancellation in the session-based revisions: the call runs on and is
        # audited as what it was.
        records = gw.wait_records("tool.call", before + 1, timeout=15)[before:]
    finally:
        client.close()
    assert len(records) == 1
    assert records[0]["outcome"] == "allowed", records[0]
    assert records[0]["latency_ms"]["upstream"] >= 1400
    assert not any("cancelled" in e for e in upstream_notes(gw, tag))
    assert "Traceback" not in gw.stderr()
