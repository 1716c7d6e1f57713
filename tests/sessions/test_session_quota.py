"""One principal can never use up the session capacity others need (``sessions.max_per_principal``): in memory,
and in Redis across replicas. Past its quota a principal's own least recently used session ends, reported as
evicted (never as expired), and the table's global cap is shared fairly."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from bastion.errors import HttpError
from bastion.sessions.cache import CachedSessionStore
from bastion.sessions.fallback import FallbackSessionStore
from bastion.sessions.redis_store import RedisSessionStore
from bastion.sessions.store import MemorySessionStore, SessionData, new_session_id
from bastion.sessions.sweep import IndexedRedisSessions
from tests.support.redis_server import RedisServer


def session(principal: str = "alice") -> SessionData:
    return SessionData(id=new_session_id(), principal_id=principal, protocol_version="2025-11-25",
                       client_info={"name": "t", "version": "1"}, created_at=time.time())


# -- memory ---------------------------------------------------------------------------------------------------


async def test_memory_a_principal_past_its_quota_ends_its_own_least_recently_used_session() -> None:
    evicted: list[str] = []
    expired: list[str] = []
    store = MemorySessionStore(3600, 1000, max_per_principal=3, on_evicted=lambda d: evicted.append(d.id),
                               on_expired=lambda d: expired.append(d.id))
    bob = session("bob")
    await store.create(bob)
    a = [session() for _ in range(3)]
    for s in a:
        await store.create(s)
    assert await store.get(a[0].id) == a[0]  # used: a[1] is now the least recently used
    extra = [session() for _ in range(2)]
    for s in extra:
        await store.create(s)
    assert evicted == [a[1].id, a[2].id]
    assert expired == []
    assert store.held_by("alice") == 3
    assert [await store.get(s.id) is not None for s in (a[0], *extra)] == [True, True, True]
    assert await store.get(a[1].id) is None
    assert await store.get(bob.id) == bob  # another principal's session is never touched by alice's quota


async def test_memory_one_principal_cannot_lock_others_out_of_a_full_table() -> None:
    evicted: list[str] = []
    store = MemorySessionStore(3600, 10, max_per_principal=10, on_evicted=lambda d: evicted.append(d.principal_id))
    for _ in range(10):
        await store.create(session("alice"))
    assert await store.count() == 10
    for who in ("bob", "root"):
        await store.create(session(who))  # alice holds the most: her least recently used seat goes
    assert evicted == ["alice", "alice"]
    assert store.held_by("alice") == 8
    # Shares even out: bob may take seats from alice only while she would still hold more than he does.
    with pytest.raises(HttpError) as refused:  # noqa: PT012
        for _ in range(10):
            await store.create(session("bob"))
    assert refused.value.status == 503
    assert store.held_by("alice") >= store.held_by("bob") - 1
    assert store.held_by("root") == 1


async def test_memory_peek_is_not_a_use() -> None:
    store = MemorySessionStore(0.2, 10)
    s = session()
    await store.create(s)
    for _ in range(4):
        await asyncio.sleep(0.07)
        await store.peek(s.id)
    assert await store.peek(s.id) is None  # 0.28 s after its last use, peeks or not
    assert await store.get(s.id) is None


async def test_memory_a_deleted_or_expired_session_frees_its_principals_share() -> None:
    store = MemorySessionStore(0.05, 10, max_per_principal=2, on_evicted=lambda d: pytest.fail("evicted"))
    a, b = session(), session()
    await store.create(a)
    await store.create(b)
    assert await store.delete(a.id)
    await store.create(session())
    await asyncio.sleep(0.1)
    assert await store.sweep() == 0
    assert store.held_by("alice") == 0
    await store.create(session())
    await store.create(session())


# -- Redis ----------------------------------------------------------------------------------------------------


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(redis_server.url, socket_timeout=2.0, socket_connect_timeout=2.0)
    yield r
    await r.aclose()


@pytest.fixture
def prefix() -> str:
    return f"test:quota:{uuid.uuid4().hex}:"


def replica(client: aioredis.Redis, prefix: str, *, quota: int, idle_s: float = 60.0,
            evicted: list[str] | None = None, expired: list[str] | None = None,
            layered: bool = False) -> IndexedRedisSessions:
    redis_store = RedisSessionStore(client, idle_timeout_s=idle_s, key_prefix=prefix)
    store = redis_store if not layered else CachedSessionStore(
        FallbackSessionStore(redis_store, idle_timeout_s=idle_s, max_sessions=100), idle_timeout_s=idle_s,
        max_sessions=100)
    return IndexedRedisSessions(store, client, key_prefix=prefix, max_per_principal=quota, idle_timeout_s=idle_s,
                                on_expired=lambda d: (expired if expired is not None else []).append(d.id),
                                on_evicted=lambda d: (evicted if evicted is not None else []).append(d.id))


async def alive(client: aioredis.Redis, prefix: str, sessions: list[SessionData]) -> list[bool]:
    return [bool(await client.exists(prefix + s.id)) for s in sessions]


async def test_redis_a_principal_past_its_quota_ends_its_own_least_recently_used_session_on_every_replica(
        client: aioredis.Redis, prefix: str) -> None:
    evicted: list[str] = []
    a, b = (replica(client, prefix, quota=3, evicted=evicted) for _ in range(2))
    bob = session("bob")
    await a.create(bob)
    mine = [session() for _ in range(3)]
    # Uses a few milliseconds apart: the order is read from TTLs in milliseconds.
    await a.create(mine[0])
    await asyncio.sleep(0.01)
    await b.create(mine[1])
    await asyncio.sleep(0.01)
    await a.create(mine[2])
    await asyncio.sleep(0.01)
    assert await b.get(mine[0].id) is not None  # a use on another replica: mine[1] is now least recently used
    new = session()
    await b.create(new)
    assert evicted == [mine[1].id]
    assert await alive(client, prefix, [*mine, new, bob]) == [True, False, True, True, True]
    assert await a.get(mine[1].id) is None
    # The evicted session left the index too: no replica's sweep reports it as expired later.
    assert not await client.hexists(prefix.rstrip(":") + "-index", mine[1].id)
    assert await client.zcard(prefix.rstrip(":") + "-principal:alice") == 3
    assert await client.zcard(prefix.rstrip(":") + "-principal:bob") == 1


async def test_redis_concurrent_creates_on_several_replicas_keep_the_bound(client: aioredis.Redis,
                                                                           prefix: str) -> None:
    evicted: list[str] = []
    replicas = [replica(client, prefix, quota=5, evicted=evicted) for _ in range(3)]
    created = [session() for _ in range(60)]
    await asyncio.gather(*(replicas[i % 3].create(s) for i, s in enumerate(created)))
    flags = await alive(client, prefix, created)
    assert sum(flags) == 5  # exactly the quota: never more, and a race never ends more than the excess
    assert len(evicted) == len(set(evicted)) == 55  # each end reported once
    await replicas[0].create(bob := session("bob"))
    assert await replicas[1].get(bob.id) == bob


async def test_redis_quota_counts_only_open_sessions_and_its_sets_go_with_them(client: aioredis.Redis,
                                                                               prefix: str) -> None:
    evicted: list[str] = []
    expired: list[str] = []
    store = replica(client, prefix, quota=2, idle_s=0.2, evicted=evicted, expired=expired)
    owned = prefix.rstrip(":") + "-principal:alice"
    a, b = session(), session()
    await store.create(a)
    await store.create(b)
    assert await store.delete(a.id)
    assert await client.zrange(owned, 0, -1) == [b.id.encode()]
    await asyncio.sleep(0.3)  # b expires in Redis
    c, d = session(), session()
    await store.create(c)
    await store.create(d)  # b's stale entry leaves the set; nothing open is evicted
    assert evicted == []
    assert await store.sweep() == 2
    assert expired == [b.id]
    await asyncio.sleep(0.3)
    assert await store.sweep() == 0
    assert not await client.exists(owned)


async def test_redis_eviction_through_the_cache_and_fallback_layers_takes_effect_at_once(
        client: aioredis.Redis, prefix: str) -> None:
    evicted: list[str] = []
    store = replica(client, prefix, quota=1, evicted=evicted, layered=True)
    first, second = session(), session()
    await store.create(first)
    assert await store.get(first.id) == first  # now in this replica's cache
    await asyncio.sleep(0.01)
    await store.create(second)
    assert evicted == [first.id]
    assert await store.get(first.id) is None
    assert await store.peek(first.id) is None


async def test_redis_peek_does_not_refresh_the_idle_ttl(client: aioredis.Redis, prefix: str) -> None:
    store = replica(client, prefix, quota=5, idle_s=60)
    s = session()
    await store.create(s)
    await client.pexpire(prefix + s.id, 5000)
    assert await store.peek(s.id) == s
    assert await client.pttl(prefix + s.id) <= 5000
    assert await store.get(s.id) == s
    assert await client.pttl(prefix + s.id) > 5000
