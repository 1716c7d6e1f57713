"""RedisSessionStore against a real Redis: replicas share sessions, idle expiry, delete, outages."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from bastion.errors import HttpError
from bastion.sessions.redis_store import RedisSessionStore, SessionStoreUnavailable
from bastion.sessions.store import SessionData, SessionStore, new_session_id
from tests.support.redis_server import RedisServer


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(redis_server.url, socket_timeout=2.0, socket_connect_timeout=2.0)
    yield r
    await r.aclose()


@pytest.fixture
def prefix() -> str:
    return f"test:sessions:{uuid.uuid4().hex}:"


def session(principal: str = "alice", **kw: object) -> SessionData:
    return SessionData(id=new_session_id(), principal_id=principal, protocol_version="2025-06-18",
                       client_capabilities={"roots": {"listChanged": True}}, client_info={"name": "t", "version": "1"},
                       created_at=1700000000.5, **kw)  # type: ignore[arg-type]


async def test_is_a_session_store(client: aioredis.Redis, prefix: str) -> None:
    store: SessionStore = RedisSessionStore(client, idle_timeout_s=60, key_prefix=prefix)
    assert await store.count() == 0


async def test_two_replicas_see_the_same_sessions(redis_server: RedisServer, prefix: str) -> None:
    # Two stores on two separate connections, as two bastion processes would have.
    a_client = aioredis.Redis.from_url(redis_server.url)
    b_client = aioredis.Redis.from_url(redis_server.url)
    try:
        a = RedisSessionStore(a_client, idle_timeout_s=60, key_prefix=prefix)
        b = RedisSessionStore(b_client, idle_timeout_s=60, key_prefix=prefix)
        data = session("bob")
        await a.create(data)
        got = await b.get(data.id)
        assert got == data
        assert got is not None
        assert got.principal_id == "bob"

        await b.update(replace(data, initialized=True, log_level="debug"))
        again = await a.get(data.id)
        assert again is not None
        assert again.initialized
        assert again.log_level == "debug"
        assert await a.count() == await b.count() == 1

        assert await b.delete(data.id) is True
        assert await a.get(data.id) is None
        assert await a.delete(data.id) is False
    finally:
        await a_client.aclose()
        await b_client.aclose()


async def test_key_carries_the_idle_ttl_and_get_refreshes_it(client: aioredis.Redis, prefix: str) -> None:
    store = RedisSessionStore(client, idle_timeout_s=100, key_prefix=prefix)
    data = session()
    await store.create(data)
    key = prefix + data.id
    assert 0 < await client.pttl(key) <= 100_000
    await client.pexpire(key, 5_000)  # as if most of the idle time had passed
    assert await store.get(data.id) is not None
    assert await client.pttl(key) > 5_000


async def test_idle_session_expires(client: aioredis.Redis, prefix: str) -> None:
    store = RedisSessionStore(client, idle_timeout_s=0.2, key_prefix=prefix)
    data = session()
    await store.create(data)
    # Poll with EXISTS, which (unlike the store's get) does not refresh the TTL. Bounded: 10 s at most.
    for _ in range(500):
        if not await client.exists(prefix + data.id):
            break
        await asyncio.sleep(0.02)
    assert await store.get(data.id) is None
    assert await store.count() == 0


async def test_update_does_not_resurrect_a_deleted_session(client: aioredis.Redis, prefix: str) -> None:
    store = RedisSessionStore(client, idle_timeout_s=60, key_prefix=prefix)
    data = session()
    await store.create(data)
    await store.delete(data.id)
    await store.update(replace(data, initialized=True))
    assert await store.get(data.id) is None


async def test_create_refuses_an_existing_id(client: aioredis.Redis, prefix: str) -> None:
    store = RedisSessionStore(client, idle_timeout_s=60, key_prefix=prefix)
    data = session("alice")
    await store.create(data)
    with pytest.raises(HttpError) as info:
        await store.create(replace(data, principal_id="mallory"))
    assert info.value.status == 503
    got = await store.get(data.id)
    assert got is not None
    assert got.principal_id == "alice"


async def test_foreign_ids_are_unknown_without_touching_redis_keys(client: aioredis.Redis, prefix: str) -> None:
    store = RedisSessionStore(client, idle_timeout_s=60, key_prefix=prefix)
    await client.set(prefix + "*", b"{}")
    for bad in ("*", "a b", "x" * 200, "../etc", "é"):
        assert await store.get(bad) is None
        assert await store.delete(bad) is False
    assert await client.get(prefix + "*") == b"{}"


async def test_unreadable_record_is_dropped(client: aioredis.Redis, prefix: str) -> None:
    store = RedisSessionStore(client, idle_timeout_s=60, key_prefix=prefix)
    sid = new_session_id()
    await client.set(prefix + sid, b"not json")
    assert await store.get(sid) is None
    assert await client.exists(prefix + sid) == 0


async def test_count_is_scoped_to_the_prefix(client: aioredis.Redis, prefix: str) -> None:
    store = RedisSessionStore(client, idle_timeout_s=60, key_prefix=prefix)
    other = RedisSessionStore(client, idle_timeout_s=60, key_prefix=f"test:sessions:{uuid.uuid4().hex}:")
    for _ in range(3):
        await store.create(session())
    await other.create(session())
    await client.set("unrelated:key", b"1")
    assert await store.count() == 3
    assert await other.count() == 1


async def test_glob_characters_in_the_prefix_are_literal(client: aioredis.Redis, prefix: str) -> None:
    store = RedisSessionStore(client, idle_timeout_s=60, key_prefix=prefix + "[x]*:")
    await client.set(prefix + "x-not-a-session", b"1")
    await store.create(session())
    assert await store.count() == 1


async def test_redis_outage_is_a_retryable_503(private_redis: RedisServer, prefix: str) -> None:
    r = aioredis.Redis.from_url(private_redis.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        store = RedisSessionStore(r, idle_timeout_s=60, key_prefix=prefix)
        data = session()
        await store.create(data)
        private_redis.kill()
        for op in (store.get(data.id), store.create(session()), store.update(data), store.delete(data.id),
                   store.count()):
            with pytest.raises(SessionStoreUnavailable) as info:
                await op
            assert info.value.status == 503
            assert "redis" not in info.value.message.lower()
            assert info.value.headers == {"Retry-After": "1"}
        private_redis.start()
        # The data is gone with the restarted (non-persistent) Redis, and the store works again.
        assert await store.get(data.id) is None
        await store.create(data)
        assert await store.get(data.id) == data
    finally:
        await r.aclose()


def test_rejects_a_non_positive_idle_timeout() -> None:
    r = aioredis.Redis()
    with pytest.raises(ValueError, match="positive"):
        RedisSessionStore(r, idle_timeout_s=0)
