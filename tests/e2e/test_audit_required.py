"""``audit.required: true`` with a sink that fails: every refused request is answered with its own id, and a
refused ``initialize`` leaves no session behind.

Real parts only: a real ``bastion serve``, a real redis-server (the session store, and in the second test also the
failing audit stream once it is killed), a real stdio upstream. The failing file sink is ``/dev/full``: every write
fails with ENOSPC, as on a full disk.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import ACCEPT, RpcClient, parse_body

AUDIT_UNAVAILABLE = -31005
SESSION_KEYS = "bastion:session:*"
MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
          "io.modelcontextprotocol/clientCapabilities": {}}


def _initialize(url: str, rid: Any, version: str = "2025-11-25") -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": rid, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    return httpx.post(url, content=orjson.dumps(body), timeout=30,
                      headers={"Accept": ACCEPT, "Content-Type": "application/json"})


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(url, content=body, timeout=30,
                      headers={"Accept": ACCEPT, "Content-Type": "application/json", **(headers or {})})


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def test_refused_initialize_keeps_its_id_and_leaves_no_session(tmp_path: Path, redis_server: RedisServer) -> None:
    gw = GatewayProcess({"auth": "none", "redis": {"url": redis_server.url},
                         "upstreams": {"basic": stdio_upstream()},
                         "audit": {"sinks": ["stdout", {"file": "/dev/full"}], "required": True}}, tmp_path).start()
    try:
        for rid in (0, "init-1"):
            r = _initialize(gw.url, rid)
            answer = parse_body(r)[0]
            assert answer["id"] == rid, answer
            assert answer["error"]["code"] == AUDIT_UNAVAILABLE
            assert "mcp-session-id" not in r.headers
        # No session is left in the store for the id the client never learned.
        assert list(redis.Redis.from_url(redis_server.url).scan_iter(match=SESSION_KEYS)) == []
        # The sink that worked has each start followed by its end, so no reader of the trail counts it open.
        starts = gw.records("session.start")
        ends = gw.wait_records("session.end", 2)
        assert len(starts) == 2
        assert {e["session"] for e in ends} == {s["session"] for s in starts}
        assert {e["reason"] for e in ends} == {"refused"}
        metrics = httpx.get(gw.base + "/metrics", timeout=5).text
        assert "bastion_sessions_started_total 0.0" in metrics

        # Every other request refused for its record carries its id as well.
        call = {"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": {"name": "basic__echo",
                                                                                "arguments": {"message": "x"}}}
        # No session and no _meta: refused (-32602) and audited; the audit fails.
        assert parse_body(_post(gw.url, orjson.dumps(call)))[0]["id"] == 41
        # A message refused before dispatch (a lone surrogate in the arguments), audited with its id.
        rejected = b'{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"basic__echo",' \
                   b'"arguments":{"message":"\\ud800"}}}'
        answer = parse_body(_post(gw.url, rejected))[0]
        assert (answer["id"], answer["error"]["code"]) == (42, AUDIT_UNAVAILABLE)
        # The 2026-07-28 door: a request refused at its envelope (no clientCapabilities), and one that runs.
        bad_meta = {**call, "id": 43, "params": {**call["params"], "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}
        answer = parse_body(_post(gw.url, orjson.dumps(bad_meta)))[0]
        assert (answer["id"], answer["error"]["code"]) == (43, AUDIT_UNAVAILABLE)
        modern = {**call, "id": "m-44", "params": {**call["params"], "_meta": MODERN}}
        answer = parse_body(_post(gw.url, orjson.dumps(modern), {
            "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "basic__echo"}))[-1]
        assert (answer["id"], answer["error"]["code"]) == ("m-44", AUDIT_UNAVAILABLE)
    finally:
        gw.stop()


def test_batch_items_keep_their_ids_when_the_audit_fails(tmp_path: Path) -> None:
    """A 2025-03-26 session opened while the audit stream works; then Redis goes (stream sink and store): each
    item of a batch is answered on its own, with its id, the items refused before dispatch included."""
    server = RedisServer().start()
    gw = GatewayProcess({"auth": "none", "redis": {"url": server.url}, "upstreams": {"basic": stdio_upstream()},
                         "audit": {"sinks": ["stdout", {"redis_stream": "bastion:audit", "timeout_ms": 300}],
                                   "required": True}}, tmp_path).start()
    client = RpcClient(gw.url, version="2025-03-26")
    try:
        client.initialize()
        server.kill()
        time.sleep(0.2)
        batch = b'[{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"basic__echo",' \
                b'"arguments":{"message":"\\ud800"}}},' \
                b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"basic__echo",' \
                b'"arguments":{"message":"ok"}}},' \
                b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}}]'
        r = client.http.post(gw.url, content=batch, headers={
            "Accept": ACCEPT, "Content-Type": "application/json", "Mcp-Session-Id": client.session_id or "",
            "MCP-Protocol-Version": "2025-03-26"})
        answers = orjson.loads(r.content)
        assert isinstance(answers, list), answers
        assert sorted((a["id"], a["error"]["code"]) for a in answers) == [(7, AUDIT_UNAVAILABLE),
                                                                          (8, AUDIT_UNAVAILABLE)]
        # A new session while the audit cannot record it: refused with its id, no session header.
        r = _initialize(gw.url, 5, "2025-03-26")
        assert parse_body(r)[0]["id"] == 5 and "mcp-session-id" not in r.headers
    finally:
        client.close()
        gw.stop()
        server.stop()


def test_a_forwarded_request_whose_record_cannot_be_written_is_refused(tmp_path: Path) -> None:
    """A prompt or a resource read whose ``request`` record a required sink could not write is answered with
    -31005, never with its result; the sink that worked holds the record, written before the answer."""
    gw = GatewayProcess({"auth": "none", "upstreams": {"basic": stdio_upstream()},
                         "audit": {"sinks": ["stdout", {"file": "/dev/full"}], "required": True}}, tmp_path).start()
    try:
        requests = [("prompts/get", {"name": "basic__greet", "arguments": {"language": "french"}}, "basic__greet"),
                    ("resources/read", {"uri": "basic+memo://readme"}, "basic+memo://readme")]
        for rid, (method, params, name) in enumerate(requests, start=50):
            body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": MODERN}}
            answer = parse_body(_post(gw.url, orjson.dumps(body), {
                "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, "Mcp-Name": name}))[-1]
            assert (answer["id"], answer["error"]["code"]) == (rid, AUDIT_UNAVAILABLE), answer
            assert "result" not in answer
            records = [r for r in gw.records("request") if r["request_id"] == rid]
            assert len(records) == 1 and records[0]["outcome"] == "allowed", records
    finally:
        gw.stop()


def test_a_listen_subscription_whose_record_cannot_be_written_is_released_upstream(tmp_path: Path) -> None:
    """Each resource a 2026-07-28 listen request names is subscribed to upstream, then recorded; one whose record
    a required sink could not write is not honoured, so the listen stream will never release it: bastion
    unsubscribes it at once, and the upstream is not left subscribed for a stream that does not want it."""
    received = tmp_path / "basic.jsonl"
    received.touch()
    gw = GatewayProcess({"auth": "none",
                         "upstreams": {"basic": stdio_upstream("tests.fixtures.basic_server", "--record",
                                                               str(received))},
                         "audit": {"sinks": ["stdout", {"file": "/dev/full"}], "required": True}}, tmp_path).start()
    try:
        uris = ["basic+memo://notes/a", "basic+memo://notes/b"]
        params = {"notifications": {"resourceSubscriptions": uris}, "_meta": MODERN}
        body = {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen", "params": params}
        headers = {"Accept": ACCEPT, "Content-Type": "application/json",
                   **request_headers("subscriptions/listen", params, "2026-07-28")}
        with httpx.Client(timeout=30) as http, http.stream("POST", gw.url, json=body, headers=headers) as stream:
            ack = next(orjson.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:"))
            # Read while the stream is still open: the release is owed by the listen request, not its stream.
            upstream_saw = [orjson.loads(line) for line in received.read_text().splitlines()]
        assert ack["params"]["notifications"] == {}, ack  # nothing honoured
        assert upstream_saw[:2] == [{"subscribe": "memo://notes/a"}, {"subscribe": "memo://notes/b"}]
        # Released once each, in no particular order.
        assert sorted(upstream_saw[2:], key=str) == [{"unsubscribe": "memo://notes/a"},
                                                     {"unsubscribe": "memo://notes/b"}]
        assert [(r["target"]["uri"], r["request_id"]) for r in gw.records("request")] == \
            [(uri, "listen-1") for uri in uris]
    finally:
        gw.stop()


def test_a_subscription_whose_record_cannot_be_written_does_not_stay(tmp_path: Path) -> None:
    """A ``resources/subscribe`` answered -31005 (its record could not be written) is one the client was told
    failed: the session does not keep it (a retry subscribes anew) and the upstream is released at once, not left
    subscribed until the session ends. The session opens while the audit stream works; then Redis goes."""
    received = tmp_path / "basic.jsonl"
    received.touch()
    server = RedisServer().start()
    gw = GatewayProcess({"auth": "none", "redis": {"url": server.url},
                         "upstreams": {"basic": stdio_upstream("tests.fixtures.basic_server", "--record",
                                                               str(received))},
                         "audit": {"sinks": ["stdout", {"redis_stream": "bastion:audit", "timeout_ms": 300}],
                                   "required": True}}, tmp_path).start()
    client = RpcClient(gw.url, version="2025-03-26")
    try:
        client.initialize()
        server.kill()
        answer = client.request("resources/subscribe", {"uri": "basic+memo://notes/a"})
        assert answer["error"]["code"] == AUDIT_UNAVAILABLE, answer
        upstream_saw = [orjson.loads(line) for line in received.read_text().splitlines()]
        assert upstream_saw == [{"subscribe": "memo://notes/a"}, {"unsubscribe": "memo://notes/a"}]
    finally:
        client.close()
        gw.stop()
        server.stop()
