"""A hostile upstream floods a client that does not read (or does not answer): every queue between them stays
bounded, the excess is coalesced or dropped and counted, and bastion's requests to the client are capped per call
and end with it (bastion.backlog, server.emitter). A real gateway in front of tests/fixtures/flood_server.py."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bastion.server.emitter import MAX_ASKS_IN_FLIGHT
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT, RpcClient

N = 20_000


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("flood")
    g = GatewayProcess({"auth": "none", "pinning": {"enabled": False},
                        "upstreams": {"flood": stdio_upstream("tests.fixtures.flood_server", timeout="60s")}},
                       workdir).start()
    yield g
    g.stop()


def dropped(gw: GatewayProcess, queue: str, kind: str) -> float:
    text = httpx.get(gw.base + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "bastion_relay_dropped_total" and sample.labels == {"queue": queue, "kind": kind}:
                return sample.value
    return 0.0


def wait_until(check: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.2)


def stalled(gw: GatewayProcess, method: str, path_headers: dict[str, str], body: bytes | None) -> socket.socket:
    """A connection that sends one request and reads nothing (a tiny receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    head = f"{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n" + \
        "".join(f"{k}: {v}\r\n" for k, v in path_headers.items())
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    sock.sendall(head.encode() + b"\r\n" + (body or b""))
    return sock


def sse_messages(sock: socket.socket) -> list[dict[str, Any]]:
    """Read one SSE response to its end (chunked: it ends with the zero-length chunk)."""
    sock.settimeout(60)
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    return [json.loads(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: ")]


def session(gw: GatewayProcess, capabilities: dict[str, Any] | None = None) -> RpcClient:
    client = RpcClient(gw.url)
    client.initialize(capabilities)
    return client


def test_a_progress_flood_to_a_client_that_does_not_read_is_coalesced_not_buffered(gw: GatewayProcess) -> None:
    client = session(gw)
    before = dropped(gw, "call", "progress")
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "flood__flood", "arguments": {"kind": "progress", "n": N, "size": 2000},
        "_meta": {"progressToken": "t1"}}}).encode()
    assert client.session_id is not None
    sock = stalled(gw, "POST", {"Accept": ACCEPT, "Mcp-Session-Id": client.session_id,
                                "MCP-Protocol-Version": "2025-11-25"}, body)
    with sock:
        # Most of the flood finds the queue full: kernel buffers hold a few thousand messages at most.
        wait_until(lambda: dropped(gw, "call", "progress") - before >= N // 2, "half the progress coalesced")
        messages = sse_messages(sock)
    progress = [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"]
    assert len(progress) < N // 2
    assert progress[-1] == N  # coalescing keeps the latest value
    result = [m for m in messages if m.get("id") == 7]
    assert result and result[0]["result"]["structuredContent"] == {"sent": N}
    client.close()


def test_a_resource_update_flood_to_a_stalled_get_stream_is_coalesced(gw: GatewayProcess) -> None:
    client = session(gw)
    listed = client.request("resources/list")["result"]["resources"]
    uri = next(r["uri"] for r in listed if r["uri"].endswith(f"r?n={N}"))
    assert client.session_id is not None
    before = dropped(gw, "session", "resource_updated")
    sock = stalled(gw, "GET", {"Accept": "text/event-stream", "Mcp-Session-Id": client.session_id,
                               "MCP-Protocol-Version": "2025-11-25"}, None)
    with sock:
        sock.settimeout(10)
        assert sock.recv(100).startswith(b"HTTP/1.1 200")  # the stream is open before the flood starts
        assert "result" in client.request("resources/subscribe", {"uri": uri})
        wait_until(lambda: dropped(gw, "session", "resource_updated") - before >= N // 2,
                   "half the updates coalesced")
    client.close()


def test_requests_to_the_client_are_capped_per_call_and_end_with_the_call(gw: GatewayProcess) -> None:
    client = session(gw, {"sampling": {}})
    n = 200
    rid = 11
    r = client.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                     "params": {"name": "flood__ask", "arguments": {"n": n}}})
    messages = [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: ")]
    asked = [m for m in messages if m.get("method") == "sampling/createMessage"]
    # The client never answers: only so many reach it, the rest are refused to the upstream at once.
    assert len(asked) == MAX_ASKS_IN_FLIGHT
    first = next(m for m in messages if m.get("id") == rid)["result"]["structuredContent"]
    assert first["answers"] >= n - MAX_ASKS_IN_FLIGHT
    # The call is over, so are its requests to the client: the upstream has an answer to every one of them,
    # long before client_request_timeout.
    again = client.call("flood__ask", {"n": 0})["result"]["structuredContent"]
    assert again["total"] == n
    client.close()



def refused_metric(gw: GatewayProcess) -> dict[str, float]:
    text = httpx.get(gw.base + "/metrics", timeout=10).text
    return {sample.labels["reason"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "bastion_upstream_server_requests_refused_total"
            and sample.labels.get("upstream") == "pings"}


def test_server_requests_refused_past_the_upstreams_own_bound_are_counted(tmp_path: Path) -> None:
    """An upstream that stops reading and floods pings: past its ``max_server_requests`` each one is refused,
    and every refusal is counted by reason (the log line about them is rate-limited)."""
    g = GatewayProcess({"auth": "none", "pinning": {"enabled": False}, "upstreams": {
        "pings": stdio_upstream("tests.fixtures.flood_server", "--pingflood", "3000", max_server_requests=4)}},
        tmp_path).start()
    try:
        wait_until(lambda: refused_metric(g).get("too_many", 0) >= 100, "refusals counted", limit=60)
        assert set(refused_metric(g)) <= {"too_many", "duplicate_id", "not_accepted", "no_call", "ambiguous"}
    finally:
        g.stop()
