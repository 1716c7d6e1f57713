"""Limits for the forwarded requests other than tools/call: which limits count a request, the keys of its buckets,
and its admission under both limiters (``bastion.ratelimit.forwarded``); ``methods`` in config and tool calls."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from importlib import resources

import pytest
from redis.asyncio import Redis

from bastion.errors import ConfigError, LimiterUnavailable, RateLimited
from bastion.protocol import methods as m
from bastion.ratelimit import RateLimitConfig
from bastion.ratelimit.forwarded import ForwardedLimits, Target, request_checks
from bastion.ratelimit.guard import RateLimitGuard
from bastion.ratelimit.limiter import Limiter
from bastion.ratelimit.memory import MemoryLimiter
from bastion.ratelimit.model import Allowance, ConcurrencySpec, Rate, RateLimitSpec, parse_limit
from bastion.ratelimit.redis_limiter import RedisLimiter
from tests.ratelimit.test_guard import attempt, ctx

GREET = Target.prompt("basic__greet", "basic")
NOTES = Target.resources("basic")
NOTHING = Allowance()
OTHERS = tuple(x for x in m.FORWARDED if x != m.TOOLS_CALL)


def spec(name: str, per: str = "principal", methods: list[str] | None = None, rate: str = "2/hour") -> RateLimitSpec:
    item: dict[str, object] = {"name": name, "rate": rate, "per": per}
    if methods is not None:
        item["methods"] = methods
    return parse_limit(item, "t")


def keys(method: str, target: Target, defaults: tuple[RateLimitSpec, ...] = (),
         allowance: Allowance = NOTHING) -> list[tuple[str, str]]:
    rates, _ = request_checks(defaults, (), method, "alice", target, allowance)
    return [(c.name, c.key) for c in rates]


def test_a_limit_without_methods_counts_every_forwarded_request() -> None:
    every = (spec("all"),)
    for method in OTHERS:
        assert keys(method, GREET, every) == [("all", "all:principal=alice")]


def test_methods_chooses_the_requests_a_limit_counts() -> None:
    defaults = (spec("reads", methods=["resources/read"]), spec("prompts", methods=["prompts/get"]))
    assert keys(m.RESOURCES_READ, NOTES, defaults) == [("reads", "reads:principal=alice")]
    assert keys(m.PROMPTS_GET, GREET, defaults) == [("prompts", "prompts:principal=alice")]
    assert keys(m.COMPLETE, GREET, defaults) == []


def test_principal_tool_keys_a_prompt_by_name_and_a_resource_by_its_upstream_never_the_uri() -> None:
    per_target = (spec("t", per="principal_tool"),)
    assert keys(m.PROMPTS_GET, GREET, per_target) == [("t", "t:principal=alice,prompt=basic__greet")]
    # Every URI of one upstream is one bucket: a client cannot mint keys by varying the URI.
    assert keys(m.RESOURCES_READ, NOTES, per_target) == [("t", "t:principal=alice,resources=basic")]
    # A prompt and a tool of the same name are different buckets.
    assert "tool=basic__greet" not in keys(m.PROMPTS_GET, GREET, per_target)[0][1]


def test_upstream_and_global_scopes() -> None:
    defaults = (spec("up", per="upstream"), spec("all", per="global"))
    assert keys(m.RESOURCES_READ, NOTES, defaults) == [("up", "up:upstream=basic"), ("all", "all:global")]


def test_a_policy_limit_replaces_a_default_of_its_name_only_for_the_methods_it_counts() -> None:
    defaults = (spec("shared"),)
    narrow = Allowance(limits=(spec("shared", per="upstream", methods=["prompts/get"]),))
    assert keys(m.PROMPTS_GET, GREET, defaults, narrow) == [("shared", "shared:upstream=basic")]
    assert keys(m.RESOURCES_READ, NOTES, defaults, narrow) == [("shared", "shared:principal=alice")]


def test_caps_follow_the_same_selection() -> None:
    caps = (ConcurrencySpec("reads", "principal", 1, frozenset({"resources/read"})),
            ConcurrencySpec("all", "upstream", 2))
    _, held = request_checks((), caps, m.PROMPTS_GET, "alice", GREET, Allowance())
    assert [(c.name, c.key, c.max) for c in held] == [("all", "all:upstream=basic", 2)]


@pytest.mark.parametrize(("bad", "message"), [
    ([], "methods must be a non-empty list"),
    ("prompts/get", "methods must be a non-empty list"),
    (["tools/list"], "'tools/list' is not a request bastion forwards"),
    (["ping"], "'ping' is not a request bastion forwards"),
])
def test_methods_are_checked_at_load(bad: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        RateLimitConfig.from_mapping({"defaults": [{"name": "x", "rate": "1/s", "methods": bad}]})
    assert message in info.value.message
    assert info.value.path is not None and info.value.path.startswith("rate_limits.defaults[0].methods")
    with pytest.raises(ConfigError):
        RateLimitConfig.from_mapping({"concurrency": [{"name": "x", "max": 1, "methods": bad}]})


def test_the_policy_and_audit_schemas_name_exactly_the_forwarded_methods() -> None:
    policy = json.loads(resources.files("bastion.policy").joinpath("schema.json").read_text())
    found = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "methods" in node and isinstance(node["methods"], dict):
                found.append(node["methods"]["items"]["enum"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(policy)
    assert found == [list(m.FORWARDED), list(m.FORWARDED)]
    audit = json.loads(resources.files("bastion.audit").joinpath("schema.json").read_text())
    assert audit["$defs"]["request"]["properties"]["method"]["enum"] == list(OTHERS)


async def admit(limits: ForwardedLimits, method: str, target: Target = NOTES,
                allowance: Allowance = NOTHING) -> None:
    async with AsyncExitStack() as cleanup:
        await limits.admit(method, "alice", target, allowance, cleanup)


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest, redis_client: Redis, prefix: str) -> Limiter:
    if request.param == "memory":
        return MemoryLimiter()
    return RedisLimiter(redis_client, key_prefix=prefix, timeout_s=5.0)


async def test_a_flood_of_reads_is_refused_at_the_limit(limiter: Limiter) -> None:
    limits = ForwardedLimits(limiter, RateLimitConfig(defaults=(spec("per-caller", rate="3/hour"),)))
    for _ in range(3):
        await admit(limits, m.RESOURCES_READ)
    with pytest.raises(RateLimited) as info:
        await admit(limits, m.RESOURCES_READ)
    assert info.value.code == -31001 and info.value.limit == "per-caller"
    # One budget for every method it counts.
    with pytest.raises(RateLimited):
        await admit(limits, m.PROMPTS_GET, GREET)
    assert limiter.stats.rejected == 2


async def test_a_cap_holds_for_the_request_and_is_given_back(limiter: Limiter) -> None:
    limits = ForwardedLimits(limiter, RateLimitConfig(concurrency=(ConcurrencySpec("inflight", "principal", 1),)))
    async with AsyncExitStack() as cleanup:
        await limits.admit(m.PROMPTS_GET, "alice", GREET, Allowance(), cleanup)
        with pytest.raises(RateLimited) as info:
            await admit(limits, m.RESOURCES_READ)
        assert info.value.data == {"limit": "inflight", "retryAfter": 1000, "kind": "concurrency"}
    await admit(limits, m.RESOURCES_READ)


async def test_a_refused_rate_gives_the_lease_back(limiter: Limiter) -> None:
    limits = ForwardedLimits(limiter, RateLimitConfig(defaults=(spec("once", rate="1/hour"),),
                                                      concurrency=(ConcurrencySpec("inflight", "principal", 1),)))
    await admit(limits, m.RESOURCES_READ)
    for _ in range(2):
        with pytest.raises(RateLimited) as info:
            await admit(limits, m.RESOURCES_READ)
        assert info.value.limit == "once"  # not "inflight": the refused request's lease was released


async def test_policy_limits_apply_without_any_default() -> None:
    limits = ForwardedLimits(MemoryLimiter(), RateLimitConfig())
    allowance = Allowance(limits=(spec("rule", rate="1/hour"),))
    await admit(limits, m.RESOURCES_READ, allowance=allowance)
    with pytest.raises(RateLimited):
        await admit(limits, m.RESOURCES_READ, allowance=allowance)
    await admit(limits, m.RESOURCES_READ)  # no limit attached: nothing counts it


async def test_a_closed_limiter_without_redis_refuses_with_limiter_unavailable(prefix: str) -> None:
    dead = Redis.from_url("redis://127.0.0.1:1/0", socket_timeout=0.2, socket_connect_timeout=0.2)
    try:
        limits = ForwardedLimits(RedisLimiter(dead, key_prefix=prefix, timeout_s=0.5),
                                 RateLimitConfig(defaults=(spec("x"),)))
        with pytest.raises(LimiterUnavailable):
            await admit(limits, m.RESOURCES_READ)
    finally:
        await dead.aclose()


async def test_a_tool_call_is_not_counted_by_a_limit_of_other_methods() -> None:
    cfg = RateLimitConfig(defaults=(spec("prompts-only", rate="1/hour", methods=["prompts/get"]),
                                    RateLimitSpec("calls", "principal", Rate(2, 3600.0),
                                                  methods=frozenset({"tools/call"}))),
                          concurrency=(ConcurrencySpec("reads", "principal", 1, frozenset({"resources/read"})),))
    guard = RateLimitGuard(MemoryLimiter(), cfg)
    for _ in range(2):
        await attempt(guard, ctx())
    with pytest.raises(RateLimited) as info:
        await attempt(guard, ctx())
    assert info.value.limit == "calls"
