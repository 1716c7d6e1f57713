"""One table of GCRA behaviour, run against the pure function (through the in-memory limiter) and the Lua script.

The Lua script is driven at explicit instants (its optional ``now`` argument) so both see the same clock. Times
sit near today's epoch in microseconds, where a careless float-to-string conversion in Lua would lose digits.
Emission intervals are seconds long so the keys' real Redis TTLs cannot lapse while a scenario runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from bastion.ratelimit.gcra import RateCheck, admit
from bastion.ratelimit.memory import MemoryLimiter
from bastion.ratelimit.scripts import GCRA, Script

T0 = 1_760_000_000_123_457
S = 1_000_000


@dataclass(frozen=True)
class Step:
    at: int  # offset from T0, us
    calls: tuple[tuple[str, int], ...]  # (limit name, cost)
    allowed: bool
    tripped: str | None = None
    retry_us: int = 0


@dataclass(frozen=True)
class Scenario:
    id: str
    limits: dict[str, tuple[int, int]]  # name -> (emission_us, burst)
    steps: tuple[Step, ...]


def ok(at: int, *calls: tuple[str, int]) -> Step:
    return Step(at, calls, True)


def no(at: int, tripped: str, retry_us: int, *calls: tuple[str, int]) -> Step:
    return Step(at, calls, False, tripped, retry_us)


A1 = ("a", 1)
TABLE = [
    Scenario("burst-then-refuse-then-refill", {"a": (10 * S, 5)}, (
        ok(0, A1), ok(0, A1), ok(0, A1), ok(0, A1), ok(0, A1),
        no(0, "a", 10 * S, A1),
        no(4 * S, "a", 6 * S, A1),
        ok(10 * S, A1),
        no(10 * S, "a", 10 * S, A1),
    )),
    Scenario("weights", {"a": (10 * S, 10)}, (
        ok(0, ("a", 4)), ok(0, ("a", 4)),
        no(0, "a", 20 * S, ("a", 4)),
        ok(0, ("a", 2)),
        no(0, "a", 10 * S, A1),
    )),
    Scenario("cost-above-burst-never-fits", {"a": (10 * S, 3)}, (
        no(0, "a", 10 * S, ("a", 4)),
        ok(0, ("a", 3)),
    )),
    Scenario("zero-cost-always-passes", {"a": (10 * S, 1)}, (
        ok(0, A1), ok(0, ("a", 0)), no(0, "a", 10 * S, A1),
    )),
    Scenario("all-or-nothing", {"a": (10 * S, 3), "b": (10 * S, 1)}, (
        ok(0, A1, ("b", 1)),
        no(0, "b", 10 * S, A1, ("b", 1)),
        no(S, "b", 9 * S, A1, ("b", 1)),
        # The refused joint calls consumed nothing from a: two more fit, the third does not.
        ok(S, A1), ok(S, A1), no(S, "a", 9 * S, A1),
    )),
    Scenario("longest-wait-is-named", {"a": (10 * S, 1), "b": (100 * S, 1)}, (
        ok(0, A1, ("b", 1)),
        no(0, "b", 100 * S, A1, ("b", 1)),
        no(50 * S, "b", 50 * S, A1, ("b", 1)),
        ok(50 * S, A1),
    )),
    Scenario("idle-bucket-keeps-no-credit-beyond-burst", {"a": (10 * S, 2)}, (
        ok(0, A1), ok(0, A1), no(0, "a", 10 * S, A1),
        ok(3600 * S, A1), ok(3600 * S, A1), no(3600 * S, "a", 10 * S, A1),
    )),
    Scenario("fractional-progress", {"a": (7 * S + 3, 2)}, (
        ok(0, A1), ok(0, A1),
        no(1, "a", 7 * S + 2, A1),
        ok(7 * S + 3, A1),
    )),
]


def checks_for(scenario: Scenario, step: Step, ns: str) -> list[RateCheck]:
    return [RateCheck(name=name, key=f"{ns}:{name}", emission_us=scenario.limits[name][0],
                      burst=scenario.limits[name][1], cost=cost) for name, cost in step.calls]


@pytest.mark.parametrize("scenario", TABLE, ids=lambda s: s.id)
def test_memory_limiter_follows_table(scenario: Scenario) -> None:
    limiter = MemoryLimiter()
    for n, step in enumerate(scenario.steps):
        verdict = limiter.check_at(T0 + step.at, checks_for(scenario, step, "k"))
        assert (verdict.allowed, verdict.limit) == (step.allowed, step.tripped), f"step {n}"
        assert verdict.retry_after_ms == -(-step.retry_us // 1000), f"step {n}"


@pytest.mark.parametrize("scenario", TABLE, ids=lambda s: s.id)
async def test_lua_script_follows_table(scenario: Scenario, redis_client: Redis, prefix: str) -> None:
    script = Script(GCRA)
    for n, step in enumerate(scenario.steps):
        checks = checks_for(scenario, step, prefix)
        args: list[str | int] = [str(T0 + step.at)]
        for c in checks:
            args += [c.emission_us, c.burst, c.cost]
        allowed, tripped, retry_us, now = await script(redis_client, [c.key for c in checks], args)
        assert now == T0 + step.at
        tripped_name = checks[tripped - 1].name if tripped else None
        assert (bool(allowed), tripped_name, retry_us) == (step.allowed, step.tripped, step.retry_us), f"step {n}"


async def test_lua_tat_round_trips_exactly(redis_client: Redis, prefix: str) -> None:
    # The table would pass with a TAT a few microseconds off; this would not.
    key = f"{prefix}:exact"
    args: list[str | int] = [str(T0), 3, 5, 1]
    await Script(GCRA)(redis_client, [key], args)
    assert int(await redis_client.get(key)) == T0 + 3


def test_refused_admission_reports_rounded_up_milliseconds() -> None:
    check = RateCheck("a", "k", emission_us=1500, burst=1)
    first = admit(T0, [None], [check])
    second = admit(T0, [first.tats[0]], [check])
    assert (second.allowed, second.retry_after_us, second.retry_after_ms) == (False, 1500, 2)
