"""The Redis limiter against a real Redis: exactness across tasks, clients and processes; weights, refill, keys."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from redis.asyncio import Redis

from bastion.ratelimit.gcra import RateCheck
from bastion.ratelimit.model import Rate, RateLimitSpec
from bastion.ratelimit.redis_limiter import RedisLimiter
from bastion.redisconn import limiter_options, open_lean
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]


def limiter_for(client: Redis, prefix: str) -> RedisLimiter:
    # A generous timeout: these tests are about counting, and a busy CI box must not turn them into outages.
    return RedisLimiter(client, key_prefix=prefix, timeout_s=10.0)


def check(name: str, rate: str, *, burst: int | None = None, key: str = "global", cost: int = 1) -> RateCheck:
    count, period = rate.split("/")
    spec = RateLimitSpec(name=name, scope="global", rate=Rate(int(count), float(period)), burst=burst)
    return RateCheck.from_spec(spec, f"{name}:{key}", cost=cost)


async def admitted(limiter: RedisLimiter, checks: list[RateCheck], n: int) -> int:
    verdicts = await asyncio.wait_for(asyncio.gather(*(limiter.check(checks) for _ in range(n))), 30)
    return sum(v.allowed for v in verdicts)


async def test_concurrent_callers_get_exactly_the_limit(redis_client: Redis, prefix: str) -> None:
    limiter = limiter_for(redis_client, prefix)
    assert await admitted(limiter, [check("exact", "20/3600")], 100) == 20
    assert limiter.stats.rejected == 80


async def test_two_replicas_share_one_budget(redis_server: RedisServer, prefix: str) -> None:
    clients = [Redis.from_url(redis_server.url) for _ in range(2)]
    try:
        one, two = (limiter_for(c, prefix) for c in clients)
        counts = await asyncio.gather(admitted(one, [check("exact", "25/3600")], 60),
                                      admitted(two, [check("exact", "25/3600")], 60))
        assert sum(counts) == 25
    finally:
        for c in clients:
            await c.aclose()


async def test_the_lean_client_counts_exactly_and_shares_the_budget_with_redis_py(redis_server: RedisServer,
                                                                                redis_client: Redis,
                                                                                prefix: str) -> None:
    """The scripts on ``bastion.resp``'s one multiplexed connection: 100 concurrent decisions, each answered to its
    own caller, and the same buckets as a limiter on redis-py (a replica configured with ``redis_client:
    redis-py``)."""
    lean = open_lean(redis_server.url, limiter_options(10.0))
    assert lean is not None
    try:
        fast = RedisLimiter(redis_client, key_prefix=prefix, timeout_s=10.0, scripts=lean)
        assert await admitted(fast, [check("exact", "20/3600")], 100) == 20
        assert fast.stats.rejected == 80
        other = limiter_for(redis_client, prefix)
        counts = await asyncio.gather(admitted(fast, [check("shared", "25/3600")], 60),
                                      admitted(other, [check("shared", "25/3600")], 60))
        assert sum(counts) == 25
    finally:
        await lean.aclose()


async def test_two_processes_share_one_budget(redis_server: RedisServer, redis_client: Redis, prefix: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tests.ratelimit.replica", "burst", redis_server.url, prefix,
                             "60", "30"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        ready = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert ready.strip() == "ready"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        mine = await admitted(limiter_for(redis_client, prefix), [check("exact", "30/3600")], 60)
        theirs = int(await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30))
        assert mine + theirs == 30
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def test_weights_spend_the_budget_faster(redis_client: Redis, prefix: str) -> None:
    limiter = limiter_for(redis_client, prefix)
    assert await admitted(limiter, [check("w", "10/3600", cost=3)], 10) == 3
    # One unit of budget is left, so a cheap call still fits and another expensive one does not.
    assert (await limiter.check([check("w", "10/3600", cost=3)])).allowed is False
    assert (await limiter.check([check("w", "10/3600", cost=1)])).allowed is True


async def test_burst_is_independent_of_the_rate(redis_client: Redis, prefix: str) -> None:
    limiter = limiter_for(redis_client, prefix)
    assert await admitted(limiter, [check("b", "1000/3600", burst=4)], 20) == 4


async def test_bucket_refills_after_retry_after(redis_client: Redis, prefix: str) -> None:
    limiter = limiter_for(redis_client, prefix)
    five = check("refill", "5/1")
    assert await admitted(limiter, [five], 5) == 5
    refused = await limiter.check([five])
    assert refused.allowed is False
    assert refused.limit == "refill"
    assert 0 < refused.retry_after_ms <= 200
    await asyncio.sleep(refused.retry_after_ms / 1000 + 0.02)
    assert (await limiter.check([five])).allowed is True
    assert (await limiter.check([five])).allowed is False


async def test_keys_are_isolated(redis_client: Redis, prefix: str) -> None:
    limiter = limiter_for(redis_client, prefix)
    assert await admitted(limiter, [check("iso", "2/3600", key="principal=alice")], 5) == 2
    assert await admitted(limiter, [check("iso", "2/3600", key="principal=bob")], 5) == 2
    assert await admitted(limiter, [check("other", "2/3600", key="principal=alice")], 5) == 2


async def test_refusal_consumes_no_other_limit(redis_client: Redis, prefix: str) -> None:
    limiter = limiter_for(redis_client, prefix)
    wide, narrow = check("wide", "10/3600"), check("narrow", "1/3600")
    assert await admitted(limiter, [wide, narrow], 5) == 1
    assert await admitted(limiter, [wide], 20) == 9


async def test_keys_are_namespaced_and_expire_when_full_again(redis_client: Redis, prefix: str) -> None:
    limiter = limiter_for(redis_client, prefix)
    await limiter.check([check("ttl", "5/1")])
    key = "{" + prefix + "}:ttl:global"  # the prefix is the Cluster hash tag
    assert [k.decode() async for k in redis_client.scan_iter(match="{" + prefix + "}:*")] == [key]
    assert 0 < await redis_client.pttl(key) <= 200
    assert await admitted(limiter, [check("ttl", "5/1")], 4) == 4
    assert 200 < await redis_client.pttl(key) <= 1000


async def test_scripts_are_reloaded_after_a_flush(redis_client: Redis, prefix: str) -> None:
    limiter = limiter_for(redis_client, prefix)
    await limiter.load_scripts()
    await redis_client.script_flush()
    assert (await limiter.check([check("reload", "1/3600")])).allowed is True
    assert (await limiter.check([check("reload", "1/3600")])).allowed is False
    assert limiter.healthy
