"""Flow context stores: the same contract in memory and in a real Redis, bounded in both."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from bastion.flow.store import FlowStore, HistoryLost, MemoryFlowStore, RedisFlowStore
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


async def test_a_history_redis_lost_raises_until_the_lost_touch_is_out_of_reach(private_redis: RedisServer) -> None:
    # Redis restarted empty (or flushed): the context read as never having touched anything, so a flow rule that
    # denied a session's exfiltration allowed it once Redis came back.
    client = open_client(private_redis.url, SHARED)
    store = RedisFlowStore(client)
    try:
        await store.add("s:a", [t("private_data", 100.0, "c1"), t("untrusted", 101.0, "c2")], retention_s=600,
                        max_touches=10)
        await store.add("s:b", [t("private_data", 100.0, "c3")], retention_s=600, max_touches=10)
        assert [x.call_id for x in await store.history("s:a", 0)] == ["c1", "c2"]
        await client.flushall()
        with pytest.raises(HistoryLost, match="s:a"):
            await store.history("s:a", 0)
        assert await store.history("s:a", 101.5) == ()  # the lost touches are out of this read's reach
        assert await store.history("s:new", 0) == ()  # a context this replica never wrote to: nothing to miss
        # A touch written after the loss, before any read: the write itself finds its predecessor gone, so a read
        # that finds the new touch still knows the history before it is incomplete.
        await store.add("s:b", [t("untrusted", 102.0, "c4")], retention_s=600, max_touches=10)
        with pytest.raises(HistoryLost, match="s:b"):
            await store.history("s:b", 0)
        assert [x.call_id for x in await store.history("s:b", 100.5)] == ["c4"]
    finally:
        await client.aclose()


async def test_a_touch_that_could_not_be_written_counts_as_lost(private_redis: RedisServer) -> None:
    client = open_client(private_redis.url, SHARED)
    store = RedisFlowStore(client, timeout_s=0.5)
    try:
        private_redis.kill()
        with pytest.raises(Exception):  # noqa: B017 - whatever the client raises
            await store.add("s:a", [t("private_data", 100.0, "c1")], retention_s=600, max_touches=10)
        private_redis.start()
        outcomes = []
        for _ in range(3):  # the first read may meet the pooled connection that died with the old server
            try:
                await store.history("s:a", 0)
                outcomes.append("read")
            except Exception as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes[-1] == "HistoryLost", outcomes
    finally:
        await client.aclose()
