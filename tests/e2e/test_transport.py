"""The front door's HTTP rules, checked with a plain HTTP client against the running gateway."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.net import free_port
from tests.support.rpc import ACCEPT, RpcClient, parse_body


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("transport")
    record = workdir / "calls.jsonl"
    g = GatewayProcess({
        "auth": "none",
        # The upstream paginates its own tools/list (3 per page); bastion pages its catalogue 4 at a time.
        "upstreams": {"basic": stdio_upstream("tests.fixtures.basic_server", "--page-size", "3", "--record",
                                              str(record), timeout="1s"),
                      "down": {"url": f"http://127.0.0.1:{free_port()}/mcp"}},
        "catalogue": {"page_size": 4},
    }, workdir).start(expect_ready=True)
    g.record_file = record  # type: ignore[attr-defined]
    yield g
    g.stop()


def init_body(version: str = "2025-11-25") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def test_initialize_negotiates_and_mints_a_session(gw: GatewayProcess) -> None:
    c = RpcClient(gw.url)
    r = c.post(init_body("2025-06-18"))
    assert r.status_code == 200
    sid = r.headers["mcp-session-id"]
    assert len(sid) >= 32
    assert all(0x21 <= ord(ch) <= 0x7E for ch in sid)
    assert parse_body(r)[0]["result"]["protocolVersion"] == "2025-06-18"
    unknown = parse_body(c.post(init_body("1999-01-01")))[0]["result"]
    assert unknown["protocolVersion"] == "2025-11-25"


def test_session_rules(gw: GatewayProcess) -> None:
    c = RpcClient(gw.url)
    assert c.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).status_code == 400  # no session
    c.session_id = "not-a-session"
    assert c.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).status_code == 404
    c.session_id = None
    c.initialize()
    assert c.post({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
    assert c.post({"jsonrpc": "2.0", "id": 3, "method": "ping"}, headers={"MCP-Protocol-Version": "1.0"}
                  ).status_code == 400
    assert c.request("ping")["result"] == {}
    assert c.http.delete(gw.url, headers={"Mcp-Session-Id": c.session_id or ""}).status_code == 200
    assert c.post({"jsonrpc": "2.0", "id": 4, "method": "ping"}).status_code == 404


def test_origin_and_host_are_checked(gw: GatewayProcess) -> None:
    c = RpcClient(gw.url)
    assert c.post(init_body(), headers={"Origin": "https://evil.example"}).status_code == 403
    assert c.post(init_body(), headers={"Origin": f"http://localhost:{gw.port}"}).status_code == 200
    assert c.post(init_body(), headers={"Host": "evil.example"}).status_code == 421


def test_malformed_bodies_get_precise_errors(gw: GatewayProcess) -> None:
    http = httpx.Client(timeout=10)
    headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
    r = http.post(gw.url, content=b"{nope", headers=headers)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32700
    r = http.post(gw.url, content=json.dumps({"jsonrpc": "1.0", "id": 1, "method": "x"}), headers=headers)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32600
    r = http.post(gw.url, content=b"x" * (5 * 1024 * 1024), headers=headers)
    assert r.status_code == 413
    r = http.post(gw.url, content=json.dumps(init_body()), headers={"Accept": ACCEPT, "Content-Type": "text/plain"})
    assert r.status_code == 415
    for accept in ("text/html", "application/json;q=0, text/event-stream;q=0", "text/event-stream"):
        # Every POST can be answered in JSON, and only that always: a client refusing JSON cannot be answered.
        r = http.post(gw.url, content=json.dumps(init_body()),
                      headers={"Accept": accept, "Content-Type": "application/json"})
        assert r.status_code == 406, accept


def test_batches_only_in_2025_03_26_sessions(gw: GatewayProcess) -> None:
    old = RpcClient(gw.url, version="2025-03-26")
    old.initialize()
    batch = [{"jsonrpc": "2.0", "id": 10, "method": "ping"}, {"jsonrpc": "2.0", "id": 11, "method": "tools/list"}]
    answers = old.post(batch).json()
    assert [a["id"] for a in answers] == [10, 11]
    new = RpcClient(gw.url)
    new.initialize()
    assert new.post(batch).status_code == 400


def test_get_and_delete_without_a_session_are_405(gw: GatewayProcess) -> None:
    assert httpx.get(gw.url, headers={"Accept": "text/event-stream"}).status_code == 405
    assert httpx.delete(gw.url).status_code == 405


def test_pagination_on_both_sides_and_a_dead_upstream(gw: GatewayProcess) -> None:
    c = RpcClient(gw.url)
    c.initialize()
    names, cursor, pages = [], None, 0
    while True:
        result = c.request("tools/list", {"cursor": cursor} if cursor else {})["result"]
        names += [t["name"] for t in result["tools"]]
        pages += 1
        cursor = result.get("nextCursor")
        if cursor is None:
            break
    # All of the upstream's pages were followed; the dead upstream is simply absent.
    assert {"basic__echo", "basic__add", "basic__whoami", "basic__mutate"} <= set(names)
    assert len(names) == len(set(names))
    assert pages == -(-len(names) // 4)
    assert c.request("tools/list", {"cursor": "garbage"})["error"]["code"] == -32602
    ready = httpx.get(gw.base + "/readyz").json()
    assert ready["checks"]["upstreams"] == {"basic": True, "down": False}


def test_a_slow_call_times_out_and_the_upstream_is_told(gw: GatewayProcess) -> None:
    c = RpcClient(gw.url)
    c.initialize()
    error = c.call("basic__slow", {"seconds": 5, "steps": 5})["error"]
    assert error["code"] == -31003
    assert error["data"] == {"upstream": "basic", "timeoutMs": 1000}
    deadline = time.monotonic() + 10
    record: Path = gw.record_file  # type: ignore[attr-defined]
    while '"cancelled"' not in record.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert '"cancelled": "slow"' in record.read_text()


def test_client_cancellation_reaches_the_upstream(gw: GatewayProcess) -> None:
    c = RpcClient(gw.url)
    c.initialize()
    args = {"seconds": 0.9, "steps": 9, "tag": "cancel-me"}
    answer: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: answer.update(
        r=c.post({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": "basic__slow",
                                                                              "arguments": args}})))
    worker.start()
    record: Path = gw.record_file  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while "cancel-me" not in record.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": 77, "reason": "user"}}).status_code == 202
    worker.join(timeout=20)
    deadline = time.monotonic() + 10
    while record.read_text().count("cancel-me") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    cancelled = [json.loads(line) for line in record.read_text().splitlines() if "cancelled" in line]
    assert any(entry["arguments"].get("tag") == "cancel-me" for entry in cancelled)


def test_a_cancellation_naming_no_request_id_cancels_nothing_and_breaks_nothing(gw: GatewayProcess) -> None:
    """``requestId`` must be a request id: an array or object is not one (bastion crashed with a 500 and logged a
    traceback on each), nor are ``true`` and ``1.0`` (they cancelled request ``1``). Each is accepted as the
    notification it is (202), names nothing, and the call runs to its answer."""
    c = RpcClient(gw.url)
    c.initialize()
    args = {"seconds": 0.9, "steps": 3, "tag": "not-cancelled"}
    answer: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: answer.update(
        r=c.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "basic__slow",
                                                                             "arguments": args}})))
    worker.start()
    record: Path = gw.record_file  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while not (record.exists() and "not-cancelled" in record.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    for bogus in ([1], {"id": 1}, [], {}, True, 1.0):
        r = c.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": bogus}})
        assert r.status_code == 202, (bogus, r.status_code, r.text)
    worker.join(timeout=20)
    (message,) = parse_body(answer["r"])
    assert "result" in message and not message["result"].get("isError"), message
    assert "Traceback" not in gw.stderr()
    assert c.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}).status_code == 200


def test_an_expired_session_is_404_and_its_end_is_audited(tmp_path: Path) -> None:
    gw = GatewayProcess({"auth": "none", "upstreams": {"basic": stdio_upstream()},
                         "sessions": {"idle_timeout": "300ms"}}, tmp_path).start()
    try:
        c = RpcClient(gw.url)
        c.initialize()
        deadline = time.monotonic() + 10
        while c.post({"jsonrpc": "2.0", "id": 9, "method": "ping"}).status_code != 404:
            assert time.monotonic() < deadline
            time.sleep(0.4)  # longer than the idle timeout, so a ping cannot keep the session alive
        ends = gw.wait_records("session.end", 1)
        assert ends
        assert ends[-1]["reason"] == "expired"
        assert ends[-1]["session"] == c.session_id
    finally:
        gw.stop()
