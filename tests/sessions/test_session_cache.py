"""CachedSessionStore against a real Redis: replicas, deletes and updates across them, idle expiry, round trips."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from bastion.ratelimit.gcra import RateCheck
from bastion.ratelimit.model import Rate, RateLimitSpec
from bastion.ratelimit.redis_limiter import RedisLimiter
from bastion.sessions.cache import CachedSessionStore
from bastion.sessions.fallback import FallbackEvent, FallbackSessionStore
from bastion.sessions.redis_store import RedisSessionStore
from bastion.sessions.store import SessionData, new_session_id
from tests.support.redis_server import RedisServer


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(redis_server.url, socket_timeout=2.0, socket_connect_timeout=2.0)
    yield r
    await r.aclose()


@pytest.fixture
def prefix() -> str:
    return f"test:cache:{uuid.uuid4().hex}:"


def session(principal: str = "alice") -> SessionData:
    return SessionData(id=new_session_id(), principal_id=principal, protocol_version="2025-06-18",
                       client_info={"name": "t", "version": "1"}, created_at=time.time())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replica(client: aioredis.Redis, prefix: str, *, idle: float = 60.0, trust: float = 1.0,
            touch_delay: float = 0.05, clock: Callable[[], float] = time.monotonic,
            events: list[FallbackEvent] | None = None, max_sessions: int = 100) -> CachedSessionStore:
    """One bastion replica's store, as app.py builds it (minus the sweep index)."""
    fallback = FallbackSessionStore(RedisSessionStore(client, idle_timeout_s=idle, key_prefix=prefix, timeout_s=0.5),
                                    idle_timeout_s=idle, max_sessions=max_sessions,
                                    on_event=events.append if events is not None else None)
    return CachedSessionStore(fallback, idle_timeout_s=idle, max_sessions=max_sessions, trust_s=trust,
                              touch_delay_s=touch_delay, clock=clock)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> float:
    """Seconds until ``check`` held; fails after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if await check():
            return time.monotonic() - start
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


async def test_a_session_deleted_on_one_replica_is_refused_on_an_idle_other_after_the_trust_window(
        client: aioredis.Redis, prefix: str) -> None:
    clock = Clock()
    a, b = replica(client, prefix), replica(client, prefix, trust=1.0, clock=clock)
    data = session()
    await a.create(data)
    assert await b.get(data.id) == data  # B now trusts its copy for a second
    await asyncio.sleep(0.2)  # B's write-behind touch confirms the session: it exists
    assert await a.delete(data.id) is True
    clock.now += 0.5
    assert await b.get(data.id) == data  # within the documented bound B may still serve it (no touch ran yet)...
    clock.now += 0.6  # ...past the bound since the last confirmation was sent, never: B asks Redis
    assert await b.get(data.id) is None
    assert await b.get(data.id) is None
    await a.aclose()
    await b.aclose()


async def test_a_session_deleted_on_one_replica_is_refused_on_a_busy_other_within_the_bound(
        client: aioredis.Redis, prefix: str) -> None:
    a, b = replica(client, prefix), replica(client, prefix, trust=1.0, touch_delay=0.05)
    data = session()
    await a.create(data)
    assert await b.get(data.id) == data
    assert await a.delete(data.id) is True
    deleted_at = time.monotonic()

    async def refused() -> bool:
        return await b.get(data.id) is None

    await eventually(refused)
    # The bound is the trust window from B's last confirmation, which was sent before the delete.
    assert time.monotonic() - deleted_at < 1.0 + 0.5  # 0.5 s of slack for a loaded machine
    assert await b.get(data.id) is None  # and it stays refused
    await a.aclose()
    await b.aclose()


async def test_a_delete_on_the_same_replica_takes_effect_at_once(client: aioredis.Redis, prefix: str) -> None:
    a = replica(client, prefix)
    data = session()
    await a.create(data)
    assert await a.get(data.id) == data
    assert await a.delete(data.id) is True
    assert await a.get(data.id) is None
    await a.aclose()


async def test_an_update_through_another_replica_reaches_a_busy_one(client: aioredis.Redis, prefix: str) -> None:
    a, b = replica(client, prefix), replica(client, prefix, touch_delay=0.05)
    data = session()
    await a.create(data)
    assert await b.get(data.id) == data
    await a.update(replace(data, initialized=True, log_level="debug"))

    async def updated() -> bool:
        got = await b.get(data.id)
        return got is not None and got.initialized and got.log_level == "debug"

    assert await eventually(updated) < 1.5
    await a.aclose()
    await b.aclose()


async def test_an_idle_session_expires_and_is_refused(client: aioredis.Redis, prefix: str) -> None:
    store = replica(client, prefix, idle=0.4)
    assert store.trust_s == pytest.approx(0.2)  # never more than half the idle timeout
    data = session()
    await store.create(data)
    assert await store.get(data.id) == data
    await asyncio.sleep(0.7)
    assert await store.get(data.id) is None
    assert await client.exists(prefix + data.id) == 0
    await store.aclose()


async def test_requests_served_from_the_copy_keep_the_session_alive(client: aioredis.Redis, prefix: str) -> None:
    # Idle timeout 0.4 s, used every 50 ms for 1.2 s: the write-behind touches must keep the Redis key alive.
    store = replica(client, prefix, idle=0.4, touch_delay=0.05)
    data = session()
    await store.create(data)
    for _ in range(24):
        assert await store.get(data.id) == data
        await asyncio.sleep(0.05)
    assert store.hits > store.misses
    assert await client.pttl(prefix + data.id) > 0
    await store.aclose()


async def test_the_copy_is_bounded_by_max_sessions(client: aioredis.Redis, prefix: str) -> None:
    store = replica(client, prefix, max_sessions=3)
    sessions = [session() for _ in range(5)]
    for s in sessions:
        await store.create(s)
    misses = store.misses
    assert await store.get(sessions[-1].id) == sessions[-1]
    assert store.misses == misses  # recent: from the copy
    assert await store.get(sessions[0].id) == sessions[0]
    assert store.misses == misses + 1  # pushed out of the copy: asked Redis
    await store.aclose()


async def _command_calls(client: aioredis.Redis, command: str) -> int:
    stats = await client.info("commandstats")
    entry = stats.get(f"cmdstat_{command}")
    return int(entry["calls"]) if entry else 0


async def test_one_redis_round_trip_per_call_on_the_hot_path(client: aioredis.Redis, prefix: str) -> None:
    limiter = RedisLimiter(client, key_prefix=f"{prefix}rl", timeout_s=2.0)
    checks = [RateCheck.from_spec(RateLimitSpec(name="p", scope="principal", rate=Rate(10**6, 1.0)), "p:alice")]
    uncached = FallbackSessionStore(RedisSessionStore(client, idle_timeout_s=60, key_prefix=prefix),
                                    idle_timeout_s=60, max_sessions=100)
    cached = replica(client, prefix, touch_delay=0.05)
    data = session()
    await cached.create(data)
    await limiter.load_scripts()  # so that no NOSCRIPT retry counts as a call
    calls = 200

    async def trips(store: FallbackSessionStore | CachedSessionStore) -> tuple[int, int]:
        getex, evalsha = await _command_calls(client, "getex"), await _command_calls(client, "evalsha")
        for _ in range(calls):
            assert await store.get(data.id) == data
            assert (await limiter.check(checks)).allowed
        return (await _command_calls(client, "getex") - getex, await _command_calls(client, "evalsha") - evalsha)

    # Before: every call looks the session up in Redis, then runs the limiter's script.
    assert await trips(uncached) == (calls, calls)
    # After: the limiter's script per call; the session's GETEX only on the first lookup and in the write-behind
    # touches (one per touch_delay, whatever the number of calls).
    getex, evalsha = await trips(cached)
    assert evalsha == calls
    assert getex <= 1 + calls // 10
    await cached.aclose()


async def test_a_redis_outage_does_not_flap_the_fallback_store(private_redis: RedisServer) -> None:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    events: list[FallbackEvent] = []
    store = replica(client, "test:cache:", trust=0.2, touch_delay=0.05, events=events)
    data = session()
    try:
        await store.create(data)
        assert await store.get(data.id) == data
        private_redis.kill()
        # Served throughout: from the copy, then (the copy no longer vouched for) from the fallback's local copy.
        for _ in range(20):
            assert await store.get(data.id) == data
            await asyncio.sleep(0.03)
        assert events.count("unavailable") == 1
        assert "recovered" not in events  # a copy hit is not Redis answering
    finally:
        await store.aclose()
        await client.aclose()
