"""Redis killed, frozen and restarted under a live limiter: the failure mode decides, and service recovers.

Every test runs twice: with the scripts on redis-py's client, and on the lean client of ``bastion.resp`` (the
default for a single server), which must fail, time out and recover exactly as redis-py does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError
from structlog.testing import capture_logs

from bastion.errors import LimiterUnavailable
from bastion.ratelimit.gcra import RateCheck
from bastion.ratelimit.limiter import CapCheck, LimiterEvent
from bastion.ratelimit.redis_limiter import FailureMode, RedisLimiter
from bastion.redisconn import ClientOptions, open_lean
from bastion.resp import LeanRedis
from tests.support.redis_server import RedisServer

CHECK = RateCheck(name="fm", key="fm:global", emission_us=1_000_000, burst=1000)
CAP = CapCheck(name="cap", key="cap:global", max=5)


@pytest.fixture
async def client(private_redis: RedisServer) -> AsyncIterator[Redis]:
    c = Redis.from_url(private_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    yield c
    await c.aclose()


@pytest.fixture(params=["redis-py", "fast"])
async def scripts(request: pytest.FixtureRequest, private_redis: RedisServer) -> AsyncIterator[LeanRedis | None]:
    if request.param == "redis-py":
        yield None
        return
    lean = open_lean(private_redis.url, ClientOptions(socket_timeout_s=0.5, connect_timeout_s=0.5))
    assert lean is not None
    yield lean
    await lean.aclose()


def make(client: Redis, mode: FailureMode, events: list[tuple[LimiterEvent, str | None]],
         scripts: LeanRedis | None) -> RedisLimiter:
    return RedisLimiter(client, key_prefix="fm", failure_mode=mode, timeout_s=1.0,
                        on_event=lambda e, limit: events.append((e, limit)), scripts=scripts)


async def until_allowed(limiter: RedisLimiter) -> None:
    """Redis was restarted: the limiter must come back by itself (the first call may still meet a dead socket)."""
    while True:
        try:
            verdict = await limiter.check([CHECK])
        except LimiterUnavailable:
            await asyncio.sleep(0.05)
            continue
        if not verdict.degraded:
            return
        await asyncio.sleep(0.05)


async def test_closed_refuses_while_redis_is_down_and_recovers(private_redis: RedisServer, client: Redis,
                                                               scripts: LeanRedis | None) -> None:
    events: list[tuple[LimiterEvent, str | None]] = []
    limiter = make(client, "closed", events, scripts)
    assert (await asyncio.wait_for(limiter.check([CHECK]), 10)).allowed
    private_redis.kill()
    with capture_logs() as logs:
        for _ in range(3):
            with pytest.raises(LimiterUnavailable) as info:
                await asyncio.wait_for(limiter.check([CHECK]), 10)
        with pytest.raises(LimiterUnavailable):
            async with asyncio.timeout(10), limiter.lease([CAP]):
                pass
        assert info.value.to_error()["code"] == -31004
        assert "127.0.0.1" not in info.value.message
        assert not limiter.healthy
        assert limiter.stats.failed_closed == 4
        private_redis.start()
        await asyncio.wait_for(until_allowed(limiter), 20)
    assert limiter.healthy
    names = [entry["event"] for entry in logs]
    assert names.count("ratelimit.redis_unavailable") == 1
    assert names.count("ratelimit.redis_recovered") == 1
    assert [e for e, _ in events if e.startswith("redis_")] == ["redis_unavailable", "redis_recovered"]
    unavailable = next(entry for entry in logs if entry["event"] == "ratelimit.redis_unavailable")
    assert unavailable["log_level"] == "warning"
    assert unavailable["failure_mode"] == "closed"


async def test_open_allows_while_redis_is_down_and_recovers(private_redis: RedisServer, client: Redis,
                                                               scripts: LeanRedis | None) -> None:
    events: list[tuple[LimiterEvent, str | None]] = []
    limiter = make(client, "open", events, scripts)
    assert (await asyncio.wait_for(limiter.check([CHECK]), 10)).allowed
    private_redis.kill()
    with capture_logs() as logs:
        verdicts = [await asyncio.wait_for(limiter.check([CHECK]), 10) for _ in range(3)]
        assert all(v.allowed and v.degraded for v in verdicts)
        async with asyncio.timeout(10), limiter.lease([CAP]):
            pass  # not counted, not refused
        assert limiter.stats.failed_open == 4
        private_redis.start()
        await asyncio.wait_for(until_allowed(limiter), 20)
    names = [entry["event"] for entry in logs]
    assert names.count("ratelimit.redis_unavailable") == 1
    assert names.count("ratelimit.redis_recovered") == 1
    assert events.count(("failed_open", None)) == 4
    # Counting resumes on the restarted (empty) Redis.
    async with asyncio.timeout(10), limiter.lease([CAP]):
        assert await client.zcard(limiter.cap_key(CAP.key)) == 1


async def test_a_frozen_redis_times_out_instead_of_hanging(private_redis: RedisServer, client: Redis,
                                                               scripts: LeanRedis | None) -> None:
    limiter = make(client, "closed", [], scripts)
    assert (await asyncio.wait_for(limiter.check([CHECK]), 10)).allowed
    with private_redis.frozen():
        with pytest.raises(LimiterUnavailable):
            await asyncio.wait_for(limiter.check([CHECK]), 10)
        assert not limiter.healthy
    await asyncio.wait_for(until_allowed(limiter), 20)
    assert limiter.healthy


async def test_leases_survive_a_redis_restart_through_the_heartbeat(private_redis: RedisServer, client: Redis,
                                                                    scripts: LeanRedis | None) -> None:
    limiter = RedisLimiter(client, key_prefix="fm", timeout_s=1.0, lease_ttl_s=0.6, scripts=scripts)
    async with limiter.lease([CAP]):
        private_redis.kill()
        private_redis.start()

        async def until_reinstated() -> None:
            while True:
                try:
                    if await client.zcard(limiter.cap_key(CAP.key)) == 1:
                        return
                except RedisError:
                    pass  # the client's first command after the restart may still meet the dead socket
                await asyncio.sleep(0.05)

        # The restarted Redis is empty; the next heartbeat puts the in-flight call back on the count.
        await asyncio.wait_for(until_reinstated(), 20)
