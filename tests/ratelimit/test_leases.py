"""Concurrency caps: held for the life of a call, released however it ends, expiring when a replica dies."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bastion.errors import RateLimited
from bastion.ratelimit.limiter import CapCheck, Limiter
from bastion.ratelimit.memory import MemoryLimiter
from bastion.ratelimit.redis_limiter import RedisLimiter
from bastion.redisconn import limiter_options, open_lean
from bastion.resp import LeanRedis
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
CAP = CapCheck(name="inflight", key="inflight:principal=alice", max=2)


@pytest.fixture(params=["memory", "redis", "redis-fast"])
async def limiter(request: pytest.FixtureRequest, redis_server: RedisServer, prefix: str) -> AsyncIterator[Limiter]:
    if request.param == "memory":
        yield MemoryLimiter()
        return
    # redis-fast: the scripts on the lean client (bastion.resp), as a gateway on a single server runs them. All
    # of the limiter's traffic must go through it: the redis-py client it is given then reaches no server.
    lean = open_lean(redis_server.url, limiter_options(10.0)) if request.param == "redis-fast" else None
    client = Redis.from_url(redis_server.url if lean is None else "redis://127.0.0.1:1/0")
    yield RedisLimiter(client, key_prefix=prefix, timeout_s=10.0, scripts=lean)
    if lean is not None:
        await lean.aclose()
    await client.aclose()


async def in_flight(limiter: Limiter, cap: CapCheck = CAP) -> int:
    if isinstance(limiter, RedisLimiter):
        scripts, key = limiter._scripts, limiter.cap_key(cap.key)
        if isinstance(scripts, LeanRedis):
            return int(await scripts.execute("ZCARD", key))
        assert isinstance(scripts, Redis)
        return int(await scripts.zcard(key))
    assert isinstance(limiter, MemoryLimiter)
    return limiter.in_flight(cap.key)


async def test_cap_refuses_beyond_max_and_frees_on_exit(limiter: Limiter) -> None:
    async with limiter.lease([CAP]), limiter.lease([CAP]):
        assert await in_flight(limiter) == 2
        with pytest.raises(RateLimited) as info:
            async with limiter.lease([CAP]):
                pass
        assert info.value.limit == "inflight"
        assert info.value.data == {"limit": "inflight", "retryAfter": 1000, "kind": "concurrency"}
    assert await in_flight(limiter) == 0
    async with limiter.lease([CAP]):
        assert await in_flight(limiter) == 1
    assert limiter.stats.rejected == 1


async def test_lease_is_released_when_the_call_fails(limiter: Limiter) -> None:
    with pytest.raises(ValueError, match="upstream broke"):
        async with limiter.lease([CAP]):
            raise ValueError("upstream broke")
    assert await in_flight(limiter) == 0


async def test_lease_is_released_when_the_call_times_out(limiter: Limiter) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05), limiter.lease([CAP]):
            await asyncio.sleep(30)
    assert await in_flight(limiter) == 0


async def test_lease_is_released_when_the_client_disconnects(limiter: Limiter) -> None:
    entered = asyncio.Event()

    async def call() -> None:
        async with limiter.lease([CAP]):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(call())
    await asyncio.wait_for(entered.wait(), 10)
    assert await in_flight(limiter) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    await asyncio.wait_for(limiter.aclose(), 10)
    assert await in_flight(limiter) == 0


async def test_caps_are_all_or_nothing(limiter: Limiter) -> None:
    upstream = CapCheck(name="upstream", key="upstream:upstream=files", max=1)
    async with limiter.lease([upstream]):
        with pytest.raises(RateLimited, match="upstream"):
            async with limiter.lease([CAP, upstream]):
                pass
        assert await in_flight(limiter, CAP) == 0


async def test_heartbeat_keeps_a_long_call_counted(redis_server: RedisServer, prefix: str) -> None:
    client = Redis.from_url(redis_server.url)
    limiter = RedisLimiter(client, key_prefix=prefix, timeout_s=10.0, lease_ttl_s=1.5)
    one = CapCheck(name="one", key="one:global", max=1)
    try:
        async with limiter.lease([one]):
            await asyncio.sleep(2.5)  # longer than the TTL: only renewals keep the lease
            with pytest.raises(RateLimited):
                async with limiter.lease([one]):
                    pass
    finally:
        await client.aclose()


async def test_dead_replica_lease_expires(redis_server: RedisServer, redis_client: Redis, prefix: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tests.ratelimit.replica", "hold", redis_server.url, prefix,
                             "1.0"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    limiter = RedisLimiter(redis_client, key_prefix=prefix, timeout_s=10.0)
    one = CapCheck(name="one", key="one:global", max=1)
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)).strip() == "held"
        with pytest.raises(RateLimited):
            async with limiter.lease([one]):
                pass
    finally:
        proc.kill()  # SIGKILL: no release, no more heartbeats
        proc.wait(timeout=10)

    async def until_free() -> None:
        while True:
            try:
                async with limiter.lease([one]):
                    return
            except RateLimited:
                await asyncio.sleep(0.1)

    await asyncio.wait_for(until_free(), 20)
    key = limiter.cap_key(one.key)
    assert await redis_client.zcard(key) == 0
    assert await redis_client.exists(key) == 0


async def test_lease_keys_expire_with_their_last_lease(redis_client: Redis, prefix: str) -> None:
    limiter = RedisLimiter(redis_client, key_prefix=prefix, timeout_s=10.0, lease_ttl_s=30.0)
    async with limiter.lease([CAP]):
        assert 0 < await redis_client.pttl(limiter.cap_key(CAP.key)) <= 30_000
