"""Sessions through a Redis outage: a real redis-server killed (SIGKILL), frozen (SIGSTOP) and restarted.

The fallback store serves what this replica has seen, refuses what it has not, replays what changed during the
outage once Redis answers, and writes its sessions back to a Redis that came back empty.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from bastion.redisconn import SHARED, open_client
from bastion.sessions.fallback import FallbackEvent, FallbackSessionStore
from bastion.sessions.redis_store import RedisSessionStore, SessionStoreUnavailable
from bastion.sessions.store import SessionData, new_session_id
from tests.support.redis_server import RedisServer


def session(principal: str = "alice") -> SessionData:
    return SessionData(id=new_session_id(), principal_id=principal, protocol_version="2025-11-25",
                       created_at=time.time())


@pytest.fixture
async def client(private_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    c = open_client(private_redis.url, SHARED)
    yield c
    await c.aclose()


def stores(client: aioredis.Redis, events: list[FallbackEvent]) -> tuple[FallbackSessionStore, RedisSessionStore]:
    """This replica's store, and a plain Redis store standing for another replica."""
    mine = FallbackSessionStore(RedisSessionStore(client, idle_timeout_s=60, timeout_s=0.5), idle_timeout_s=60,
                                max_sessions=100, on_event=events.append)
    return mine, RedisSessionStore(client, idle_timeout_s=60)


async def eventually(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_an_outage_serves_known_sessions_refuses_unknown_ones_and_replays_changes(
        private_redis: RedisServer, client: aioredis.Redis) -> None:
    events: list[FallbackEvent] = []
    mine, other = stores(client, events)
    known, deleted, never_seen_here = session(), session(), session("bob")
    for s in (known, deleted):
        await mine.create(s)
    await other.create(never_seen_here)

    private_redis.kill()
    started = time.monotonic()
    assert await mine.get(known.id) == known
    with pytest.raises(SessionStoreUnavailable):
        await mine.get(never_seen_here.id)  # another replica's session: never invented
    created_during = session()
    await mine.create(created_during)
    assert await mine.get(created_during.id) == created_during
    updated = replace(known, log_level="debug")
    await mine.update(updated)
    assert await mine.delete(deleted.id)
    assert await mine.get(deleted.id) is None
    assert time.monotonic() - started < 5  # nothing waited on a dead Redis beyond its bound
    assert not mine.available

    # Redis back, with its data (the same process would have it; here: re-seeded to stand for persistence).
    private_redis.start()
    for s in (known, deleted, never_seen_here):
        await other.create(s)
    assert await mine.get(known.id) == updated  # first success: the local change wins, and the replay starts
    await eventually(lambda: _is(other.get(created_during.id), created_during))
    await eventually(lambda: _is(other.get(deleted.id), None))
    await eventually(lambda: _is(other.get(known.id), updated))
    assert mine.available
    assert events.count("unavailable") == 1 and events.count("recovered") == 1
    assert {"served_local", "refused", "created_local", "updated_local", "deleted_local", "synced"} <= set(events)
    await mine.aclose()


async def _is(value: object, expected: object) -> bool:
    return await value == expected  # type: ignore[misc]


async def test_a_redis_that_comes_back_empty_gets_the_sessions_back(private_redis: RedisServer,
                                                                    client: aioredis.Redis) -> None:
    events: list[FallbackEvent] = []
    mine, other = stores(client, events)
    sessions = [session() for _ in range(12)]
    for s in sessions:
        await mine.create(s)
    private_redis.kill()
    for s in sessions:
        assert await mine.get(s.id) == s  # served locally during the outage
    private_redis.start()  # no persistence: every session is gone from Redis
    assert await other.get(sessions[0].id) is None
    # The first requests after the restart, several per session at once (as a loaded gateway sees them): every
    # session is still valid whichever lookup notices the loss first, and Redis holds them all again.
    found = await asyncio.gather(*(mine.get(s.id) for s in sessions for _ in range(3)))
    assert found == [s for s in sessions for _ in range(3)]
    for s in sessions:
        await eventually(lambda s=s: _is(other.get(s.id), s))
    await mine.aclose()


async def test_a_session_deleted_elsewhere_stays_deleted(redis_server: RedisServer) -> None:
    c = open_client(redis_server.url, SHARED)
    try:
        mine, other = stores(c, [])
        s = session()
        await mine.create(s)
        assert await other.delete(s.id)
        assert await mine.get(s.id) is None  # Redis kept its data (same epoch): its "no such session" is the truth
        assert await other.get(s.id) is None
    finally:
        await c.aclose()


async def test_a_frozen_redis_costs_a_request_at_most_the_store_timeout(private_redis: RedisServer,
                                                                        client: aioredis.Redis) -> None:
    mine, _ = stores(client, [])
    known = session()
    await mine.create(known)
    with private_redis.frozen():
        started = time.monotonic()
        assert await asyncio.wait_for(mine.get(known.id), 10) == known
        with pytest.raises(SessionStoreUnavailable):
            await asyncio.wait_for(mine.get(new_session_id()), 10)
        # Two lookups, each bounded by the store's 0.5 s (plus scheduling slack on a loaded machine).
        assert time.monotonic() - started < 2.5
    await mine.aclose()


class _Held(RedisSessionStore):
    """The Redis store, with two gates standing for a slow network: a write-back of ``blocked`` waits before it is
    sent, and a lookup's answer waits, once read, before it is returned."""

    blocked: str | None = None
    write_gate: asyncio.Event | None = None
    answer_gate: asyncio.Event | None = None

    async def create(self, data: SessionData) -> None:
        if data.id == self.blocked and self.write_gate is not None:
            await self.write_gate.wait()
        await super().create(data)

    async def get(self, session_id: str) -> SessionData | None:
        data = await super().get(session_id)
        if self.answer_gate is not None:
            await self.answer_gate.wait()
        return data


async def test_a_lookup_answered_before_its_sessions_write_back_landed_keeps_the_session(
        private_redis: RedisServer, client: aioredis.Redis) -> None:
    """After Redis came back empty, a lookup sent after the reseed but answered "no such session" just before the
    replay wrote that session back, and seen after, must not end it: Redis holds it again (found by a primary
    killed under load, where a client's call was answered 404)."""
    inner = _Held(client, idle_timeout_s=60, timeout_s=0.5)
    mine = FallbackSessionStore(inner, idle_timeout_s=60, max_sessions=100)
    other = RedisSessionStore(client, idle_timeout_s=60)
    first, second = session(), session()
    for s in (first, second):
        await mine.create(s)
    private_redis.kill()
    private_redis.start()  # no persistence: both sessions are gone from Redis
    inner.blocked, inner.write_gate = second.id, asyncio.Event()
    assert await mine.get(first.id) == first  # notices the loss: reseeds, and the replay starts
    await eventually(lambda: _is(other.get(first.id), first))
    inner.answer_gate = asyncio.Event()
    lookup = asyncio.create_task(mine.get(second.id))  # sent while the replay waits to write ``second`` back
    await asyncio.sleep(0.2)
    assert await other.get(second.id) is None  # so the lookup read "no such session"
    inner.write_gate.set()
    await eventually(lambda: _is(other.get(second.id), second))
    inner.answer_gate.set()
    assert await lookup == second
    assert await mine.get(second.id) == second
    await mine.aclose()
