"""Several replicas behave as one gateway: one client session served alternately by two bastion processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import RpcClient, parse_body


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[list[GatewayProcess]]:
    workdir: Path = tmp_path_factory.mktemp("replicas")
    config = {"auth": "none", "redis": {"url": redis_server.url.replace("/0", "/3")},
              "upstreams": {"basic": stdio_upstream()}}
    gws = [GatewayProcess(config, workdir).start(), GatewayProcess(config, workdir).start()]
    yield gws
    for gw in gws:
        gw.stop()


def test_one_session_alternating_between_two_replicas(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    client = RpcClient(a.url)
    client.initialize()
    lists = []
    for i, gw in enumerate([a, b, a, b]):
        client.url = gw.url
        lists.append(client.tool_names())
        echoed = client.call("basic__echo", {"message": f"via replica {i % 2}"})
        assert echoed["result"]["content"][0]["text"] == f"via replica {i % 2}"
    assert all(names == lists[0] for names in lists)

    # Progress on the replica that did not open the session.
    client.url = b.url
    r = client.post({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                     "params": {"name": "basic__slow", "arguments": {"seconds": 0.2, "steps": 2},
                                "_meta": {"progressToken": "p-1"}}})
    messages = parse_body(r)
    progress = [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"]
    assert progress == [1, 2]
    assert all(m["params"]["progressToken"] == "p-1" for m in messages if m.get("method"))
    assert messages[-1]["result"]["content"][0]["text"] == "done"

    # Ending the session on one replica ends it everywhere: at once on that replica, and on the other within the
    # bound of its session cache (one second after it last heard from Redis; docs/operations.md), here sooner,
    # since the write-behind touch of a session in use finds it gone.
    client.url = a.url
    assert client.http.delete(a.url, headers={"Mcp-Session-Id": client.session_id or ""}).status_code == 200
    assert client.post({"jsonrpc": "2.0", "id": 100, "method": "tools/list"}).status_code == 404
    client.url = b.url
    deleted_at = time.monotonic()
    while client.post({"jsonrpc": "2.0", "id": 101, "method": "tools/list"}).status_code != 404:
        assert time.monotonic() - deleted_at < 1.0 + 1.0, "still served past the bound (1 s + slack for load)"
        time.sleep(0.02)
    assert client.post({"jsonrpc": "2.0", "id": 102, "method": "tools/list"}).status_code == 404


def test_sigterm_lets_an_in_flight_call_finish(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    gw = GatewayProcess({"auth": "none", "upstreams": {"basic": stdio_upstream(
        "tests.fixtures.basic_server", "--record", str(record))}}, tmp_path).start()
    client = RpcClient(gw.url)
    client.initialize()
    answer: dict[str, Any] = {}

    def call() -> None:
        answer.update(client.call("basic__slow", {"seconds": 1.5, "steps": 3}))

    worker = threading.Thread(target=call)
    worker.start()
    # Stop the gateway once the call is in flight, i.e. once the upstream has recorded receiving it.
    deadline = time.monotonic() + 20
    while not (record.exists() and "slow" in record.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "slow" in record.read_text()
    code = gw.stop(timeout=30)
    worker.join(timeout=30)
    assert answer["result"]["content"][0]["text"] == "done"
    assert code == 0


def test_without_the_session_cache_a_delete_ends_the_session_on_every_replica_at_once(
        tmp_path: Path, redis_server: RedisServer) -> None:
    config = {"auth": "none", "redis": {"url": redis_server.url.replace("/0", "/4")}, "sessions": {"cache": 0},
              "upstreams": {"basic": stdio_upstream()}}
    a, b = GatewayProcess(config, tmp_path).start(), GatewayProcess(config, tmp_path).start()
    try:
        client = RpcClient(a.url)
        client.initialize()
        client.url = b.url
        assert client.call("basic__echo", {"message": "on b"})["result"]["content"][0]["text"] == "on b"
        client.url = a.url
        assert client.http.delete(a.url, headers={"Mcp-Session-Id": client.session_id or ""}).status_code == 200
        client.url = b.url
        assert client.post({"jsonrpc": "2.0", "id": 100, "method": "tools/list"}).status_code == 404
    finally:
        a.stop()
        b.stop()
