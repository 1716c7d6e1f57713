"""The pipeline guard: which limits apply to a call, how refusals are recorded, and when leases are let go."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
from redis.asyncio import Redis

from bastion.call import CallContext, CallRecord, RequestGuard
from bastion.errors import LimiterUnavailable, RateLimited
from bastion.principal import Principal
from bastion.ratelimit import RateLimitConfig, build_limiter
from bastion.ratelimit.guard import RateLimitGuard
from bastion.ratelimit.memory import MemoryLimiter
from bastion.ratelimit.model import ALLOWANCE, Allowance, ConcurrencySpec, Rate, RateLimitSpec
from bastion.ratelimit.redis_limiter import RedisLimiter
from bastion.tool_entry import ToolEntry
from tests.support.redis_server import RedisServer


def ctx(principal: str = "alice", tool: str = "files_read", upstream: str = "files") -> CallContext:
    entry = ToolEntry(public_name=tool, upstream=upstream, original_name=tool, definition={"name": tool},
                      upstream_definition={"name": tool})
    return CallContext(request_id="1", principal=Principal(id=principal), tool=entry, arguments={})


def allowed(allowance: Allowance) -> CallRecord:
    """A record as the policy guard leaves it for a call it allowed with ``allowance``."""
    record = CallRecord()
    record.put(ALLOWANCE, allowance)
    return record


def config(**extra: object) -> RateLimitConfig:
    return RateLimitConfig.from_mapping({
        "defaults": [{"name": "per-principal", "rate": "3/hour", "per": "principal"}],
        "concurrency": [{"name": "inflight", "max": 1, "per": "principal"}],
        **extra,
    })


async def attempt(guard: RateLimitGuard, c: CallContext, record: CallRecord | None = None) -> CallRecord:
    record = record or CallRecord()
    async with AsyncExitStack() as cleanup:
        await guard.check(c, record, cleanup)
    return record


def test_guard_satisfies_the_pipeline_protocol() -> None:
    guard: RequestGuard = RateLimitGuard(MemoryLimiter(), RateLimitConfig())
    assert guard.name == "ratelimit"


async def test_default_limit_per_principal() -> None:
    guard = RateLimitGuard(MemoryLimiter(), config())
    for _ in range(3):
        await attempt(guard, ctx("alice"))
    record = CallRecord()
    with pytest.raises(RateLimited) as info:
        await attempt(guard, ctx("alice", tool="other"), record)
    assert (record.limit, record.stage, record.decision) == ("per-principal", "ratelimit", "deny")
    error = info.value.to_error()
    assert error["code"] == -31001
    assert error["data"]["limit"] == "per-principal"
    assert error["data"]["retryAfter"] > 0
    await attempt(guard, ctx("bob"))


async def test_policy_limits_cost_and_override() -> None:
    guard = RateLimitGuard(MemoryLimiter(), config())
    per_tool = RateLimitSpec(name="tool", scope="principal_tool", rate=Rate(4, 3600.0))
    # Replaces the default of the same name for this call: a larger budget.
    wider = RateLimitSpec(name="per-principal", scope="principal", rate=Rate(100, 3600.0))
    for _ in range(2):
        await attempt(guard, ctx(), allowed(Allowance(limits=(per_tool, wider), cost=2)))
    with pytest.raises(RateLimited, match=r"\(tool\)"):
        await attempt(guard, ctx(), allowed(Allowance(limits=(per_tool, wider), cost=2)))
    # Another tool of the same principal has its own per-tool bucket.
    await attempt(guard, ctx(tool="files_write"), allowed(Allowance(limits=(per_tool, wider), cost=2)))


async def test_concurrency_lease_is_held_until_cleanup() -> None:
    guard = RateLimitGuard(MemoryLimiter(), config())
    async with AsyncExitStack() as cleanup:
        await guard.check(ctx(), CallRecord(), cleanup)
        record = CallRecord()
        with pytest.raises(RateLimited):
            await attempt(guard, ctx(), record)
        assert record.limit == "inflight"
        await attempt(guard, ctx("bob"))
    await attempt(guard, ctx())


async def test_policy_attached_cap_per_upstream() -> None:
    guard = RateLimitGuard(MemoryLimiter(), RateLimitConfig())
    cap = ConcurrencySpec(name="upstream", scope="upstream", max=1)
    async with AsyncExitStack() as cleanup:
        await guard.check(ctx("alice"), allowed(Allowance(concurrency=(cap,))), cleanup)
        with pytest.raises(RateLimited):
            await attempt(guard, ctx("bob"), allowed(Allowance(concurrency=(cap,))))
        await attempt(guard, ctx("bob", upstream="github"), allowed(Allowance(concurrency=(cap,))))


async def test_scope_components_cannot_collide() -> None:
    guard = RateLimitGuard(MemoryLimiter(), RateLimitConfig())
    per_tool = RateLimitSpec(name="t", scope="principal_tool", rate=Rate(1, 3600.0))
    # Joined naively, both would be "principal=a,tool=b,tool=c" and share one bucket of 1.
    await attempt(guard, ctx("a,tool=b", tool="c"), allowed(Allowance(limits=(per_tool,))))
    await attempt(guard, ctx("a", tool="b,tool=c"), allowed(Allowance(limits=(per_tool,))))


async def test_redis_keys_follow_the_documented_layout(redis_server: RedisServer, prefix: str) -> None:
    client = Redis.from_url(redis_server.url)
    try:
        limiter = build_limiter(config(key_prefix=prefix, timeout="5s"), client)
        assert isinstance(limiter, RedisLimiter)
        guard = RateLimitGuard(limiter, config(key_prefix=prefix))
        async with AsyncExitStack() as cleanup:
            await guard.check(ctx("alice@example.com"), CallRecord(), cleanup)
            # The prefix is the Cluster hash tag: every bucket and cap of the limiter shares one slot.
            tag = "{" + prefix + "}"
            keys = sorted([k.decode() async for k in client.scan_iter(match=f"{tag}:*")])
            assert keys == [f"{tag}:cc:inflight:principal=alice@example.com",
                            f"{tag}:per-principal:principal=alice@example.com"]
        assert await client.exists(f"{tag}:cc:inflight:principal=alice@example.com") == 0
    finally:
        await client.aclose()


async def test_limiter_unavailable_is_recorded(private_redis: RedisServer) -> None:
    client = Redis.from_url(private_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        cfg = RateLimitConfig.from_mapping({"defaults": [{"name": "d", "rate": "5/second"}], "timeout": "1s"})
        guard = RateLimitGuard(build_limiter(cfg, client), cfg)
        private_redis.kill()
        record = CallRecord()
        with pytest.raises(LimiterUnavailable):
            await attempt(guard, ctx(), record)
        assert (record.stage, record.decision) == ("ratelimit", "error")
    finally:
        await client.aclose()


def test_no_redis_means_memory() -> None:
    assert isinstance(build_limiter(RateLimitConfig(), None), MemoryLimiter)


async def test_without_limits_the_limiter_is_not_asked_and_a_policy_limit_still_applies() -> None:
    limiter = MemoryLimiter()
    guard = RateLimitGuard(limiter, RateLimitConfig())
    for _ in range(5):
        record = await attempt(guard, ctx("alice"))
        assert (record.limit, record.extra) == (None, {})
    assert limiter.stats.checks == 0
    attached = Allowance(limits=(RateLimitSpec(name="from-policy", scope="principal", rate=Rate(1, 3600.0)),))
    await attempt(guard, ctx("alice"), allowed(attached))
    with pytest.raises(RateLimited):
        await attempt(guard, ctx("alice"), allowed(attached))
    assert limiter.stats.checks == 2
