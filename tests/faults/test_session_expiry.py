"""Sessions end visibly: expiry found on a timer (memory and Redis stores, several replicas), shutdown recorded."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from bastion.sessions.redis_store import RedisSessionStore
from bastion.sessions.store import MemorySessionStore, SessionData, new_session_id
from bastion.sessions.sweep import IndexedRedisSessions, SessionSweeper
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import RpcClient


def session(principal: str = "alice") -> SessionData:
    return SessionData(id=new_session_id(), principal_id=principal, protocol_version="2025-11-25",
                       client_info={"name": "t", "version": "1"}, created_at=time.time())


async def test_memory_sessions_expire_on_the_timer_without_any_access() -> None:
    expired: list[str] = []
    counts: list[int] = []
    # The store's own on-access sweep is an hour away: only the timer can find the expiry.
    store = MemorySessionStore(0.1, 100, on_expired=lambda d: expired.append(d.id), sweep_every_s=3600)

    async def on_shutdown(data: SessionData) -> None:
        raise AssertionError("nothing is left at shutdown")

    sweeper = SessionSweeper(store, 0.05, on_count=counts.append, on_shutdown=on_shutdown)
    idle = session()
    await store.create(idle)
    sweeper.start()
    try:
        async with asyncio.timeout(5):
            while not expired:
                await asyncio.sleep(0.01)
        assert expired == [idle.id]
        assert counts[-1] == 0
    finally:
        await sweeper.close()


async def test_memory_sessions_end_at_shutdown() -> None:
    store = MemorySessionStore(3600, 100)
    ended: list[str] = []

    async def on_shutdown(data: SessionData) -> None:
        ended.append(data.id)

    sweeper = SessionSweeper(store, 60, on_count=lambda n: None, on_shutdown=on_shutdown)
    a, b = session(), session()
    await store.create(a)
    await store.create(b)
    sweeper.start()
    await sweeper.close()
    assert sorted(ended) == sorted([a.id, b.id])
    assert await store.count() == 0


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(redis_server.url, socket_timeout=2.0, socket_connect_timeout=2.0)
    yield r
    await r.aclose()


async def test_redis_expiry_is_claimed_by_exactly_one_replica_and_a_delete_is_never_an_expiry(
        redis_client: aioredis.Redis) -> None:
    prefix = f"test:sweep:{uuid.uuid4().hex}:"
    reports: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    replicas = {name: IndexedRedisSessions(RedisSessionStore(redis_client, idle_timeout_s=0.2, key_prefix=prefix),
                                           redis_client, key_prefix=prefix,
                                           on_expired=lambda d, name=name: reports[name].append(d.id))  # type: ignore[misc]
                for name in reports}
    expiring, deleted, alive = session(), session(), session()
    await replicas["a"].create(expiring)
    await replicas["a"].create(deleted)
    assert await replicas["b"].delete(deleted.id)  # deleted through another replica than its opener
    await asyncio.sleep(0.3)
    await replicas["c"].create(alive)
    counts = await asyncio.gather(*(r.sweep() for r in replicas.values()))  # all replicas sweep at once
    everyone = [sid for ids in reports.values() for sid in ids]
    assert everyone == [expiring.id]  # exactly once, and the deleted session is not reported
    assert set(counts) == {1}  # what is still open: the alive one
    assert replicas["a"].drain() == []  # Redis sessions outlive a replica


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayProcess]:
    from tests.e2e.conftest import stdio_upstream

    gateway = GatewayProcess({"auth": "none", "sessions": {"idle_timeout": "1s", "sweep_interval": "200ms"},
                              "upstreams": {"basic": stdio_upstream()}}, tmp_path).start()
    yield gateway
    gateway.stop()


def active_sessions(gw: GatewayProcess) -> float:
    for line in httpx.get(gw.base + "/metrics").text.splitlines():
        if line.startswith("bastion_active_sessions "):
            return float(line.split()[1])
    raise AssertionError("no bastion_active_sessions")


def test_an_idle_session_ends_with_its_record_and_the_rest_end_at_shutdown(gw: GatewayProcess) -> None:
    idle, kept = RpcClient(gw.url), RpcClient(gw.url)
    idle.initialize()
    kept.initialize()
    assert active_sessions(gw) == 2
    # Keep one session busy while the other is left alone; nobody touches the idle one again.
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        assert "result" in kept.request("ping")
        time.sleep(0.2)
    ends = gw.wait_records("session.end", 1, timeout=5)
    assert [(r["session"], r["reason"]) for r in ends] == [(idle.session_id, "expired")]
    assert ends[0]["duration_ms"] >= 1000
    assert active_sessions(gw) == 1
    assert gw.stop() == 0
    ends = gw.records("session.end")
    assert [(r["session"], r["reason"]) for r in ends] == [(idle.session_id, "expired"), (kept.session_id, "shutdown")]
    idle.close()
    kept.close()


def test_with_redis_an_idle_session_ends_with_its_record_though_redis_expired_it_silently(
        tmp_path: Path, private_redis: RedisServer) -> None:
    from tests.e2e.conftest import stdio_upstream

    # A Redis of its own: the session index is shared by every gateway on one Redis, by design, so another
    # test's sessions expiring there would be (rightly) recorded by this gateway too.
    gw = GatewayProcess({"auth": "none", "redis": {"url": private_redis.url},
                         "sessions": {"idle_timeout": "1s", "sweep_interval": "200ms"},
                         "upstreams": {"basic": stdio_upstream()}}, tmp_path).start()
    client = RpcClient(gw.url)
    try:
        client.initialize()
        ends = gw.wait_records("session.end", 1, timeout=6)
        assert [(r["session"], r["reason"]) for r in ends] == [(client.session_id, "expired")]
        assert ends[0]["client"]["name"] == "rpc-test"
        assert active_sessions(gw) == 0
        assert client.post({"jsonrpc": "2.0", "id": 9, "method": "ping"}).status_code == 404
    finally:
        client.close()
        assert gw.stop() == 0
    # Redis sessions outlive a replica: its shutdown ends none of them (here none is left anyway).
    assert [r["reason"] for r in gw.records("session.end")] == ["expired"]
