"""Flow context stores: the same contract in memory and in a real Redis, bounded in both."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from bastion.flow.store import FlowStore, MemoryFlowStore, RedisFlowStore
from bastion.policy.flow import Touch
from bastion.redisconn import SHARED, open_client
from tests.support.redis_server import RedisServer


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[FlowStore]:
    if request.param == "memory":
        yield MemoryFlowStore()
        return
    client = open_client(redis_server.url, SHARED)
    await client.flushdb()
    yield RedisFlowStore(client)
    await client.aclose()


def t(label: str, at: float, call_id: str) -> Touch:
    return Touch(label, "x__y", at, call_id)


async def test_history_returns_what_was_added_since_a_time(store: FlowStore) -> None:
    await store.add("s:a", [t("p", 100.0, "1"), t("u", 200.0, "2")], retention_s=1000, max_touches=10)
    assert {x.call_id for x in await store.history("s:a", 0)} == {"1", "2"}
    assert [x.call_id for x in await store.history("s:a", 150)] == ["2"]
    assert await store.history("s:other", 0) == ()


async def test_a_context_is_bounded_by_count_and_retention(store: FlowStore) -> None:
    await store.add("s:b", [t("p", float(i), str(i)) for i in range(20)], retention_s=1000, max_touches=5)
    assert sorted(x.call_id for x in await store.history("s:b", 0)) == ["15", "16", "17", "18", "19"]
    await store.add("s:b", [t("p", 2000.0, "late")], retention_s=1000, max_touches=5)
    # Everything older than retention before the newest touch is gone.
    assert [x.call_id for x in await store.history("s:b", 0)] == ["late"]


async def test_redis_keys_carry_the_context_as_a_hash_tag_and_expire(redis_server: RedisServer) -> None:
    client: aioredis.Redis = open_client(redis_server.url, SHARED)
    try:
        store = RedisFlowStore(client)
        await store.add("s:abc", [t("p", 1.0, "1")], retention_s=60, max_touches=5)
        assert await client.exists("bastion:flow:{s:abc}") == 1
        ttl = await client.pttl("bastion:flow:{s:abc}")
        assert 0 < ttl <= 60_000
    finally:
        await client.aclose()


async def test_two_clients_of_one_redis_see_one_context(redis_server: RedisServer) -> None:
    a, b = open_client(redis_server.url, SHARED), open_client(redis_server.url, SHARED)
    try:
        await RedisFlowStore(a).add("p:alice", [t("p", 5.0, "r1")], retention_s=60, max_touches=5)
        assert [x.call_id for x in await RedisFlowStore(b).history("p:alice", 0)] == ["r1"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_redis_down_raises_for_the_guard_to_fail_closed(private_redis: RedisServer) -> None:
    client = open_client(private_redis.url, SHARED)
    store = RedisFlowStore(client, timeout_s=0.5)
    private_redis.kill()
    try:
        with pytest.raises(Exception):  # noqa: B017 - any failure: the caller treats them all alike
            await store.history("s:x", 0)
    finally:
        await client.aclose()
