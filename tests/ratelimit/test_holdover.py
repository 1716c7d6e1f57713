"""A concurrency slot counts the upstream's work, not bastion's wait: a call that gives up on its upstream request
(cancelled, timed out) keeps its slot until the upstream is done with it (``bastion.holdover``).

Real parts only: both limiter backends (memory, and Redis through either client), and a real stdio upstream whose
tool ignores cancellation (``tests.fixtures.stubborn_server``), which records when each call starts and ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from bastion.errors import RateLimited, UpstreamTimeout
from bastion.ratelimit.limiter import CapCheck, Limiter
from bastion.ratelimit.memory import MemoryLimiter
from bastion.ratelimit.redis_limiter import RedisLimiter
from bastion.redisconn import limiter_options, open_lean
from bastion.resp import LeanRedis
from bastion.upstream.stdio import StdioUpstream
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
ONE = CapCheck(name="one-at-a-time", key="one-at-a-time:principal=alice", max=1)
# Short enough that the tests below outlive it several times: only the heartbeat keeps a held-over lease alive.
LEASE_TTL_S = 0.6


class CountingMemoryLimiter(MemoryLimiter):
    releases = 0

    async def _release(self, caps: Sequence[CapCheck], lease_id: str) -> None:
        self.releases += 1
        await super()._release(caps, lease_id)


class CountingRedisLimiter(RedisLimiter):
    releases = 0

    async def _release(self, caps: Sequence[CapCheck], lease_id: str) -> None:
        self.releases += 1
        await super()._release(caps, lease_id)


@pytest.fixture(params=["memory", "redis", "redis-fast"])
async def limiter(request: pytest.FixtureRequest, redis_server: RedisServer, prefix: str) -> AsyncIterator[Limiter]:
    if request.param == "memory":
        memory = CountingMemoryLimiter(lease_ttl_s=LEASE_TTL_S)
        yield memory
        await memory.aclose()
        return
    lean = open_lean(redis_server.url, limiter_options(10.0)) if request.param == "redis-fast" else None
    client = Redis.from_url(redis_server.url if lean is None else "redis://127.0.0.1:1/0")
    redis = CountingRedisLimiter(client, key_prefix=prefix, timeout_s=10.0, lease_ttl_s=LEASE_TTL_S, scripts=lean)
    yield redis
    await redis.aclose()
    if lean is not None:
        await lean.aclose()
    await client.aclose()


def releases(limiter: Limiter) -> int:
    assert isinstance(limiter, CountingMemoryLimiter | CountingRedisLimiter)
    return limiter.releases


async def in_flight(limiter: Limiter) -> int:
    if isinstance(limiter, RedisLimiter):
        scripts, key = limiter._scripts, limiter.cap_key(ONE.key)
        if isinstance(scripts, LeanRedis):
            return int(await scripts.execute("ZCARD", key))
        assert isinstance(scripts, Redis)
        return int(await scripts.zcard(key))
    assert isinstance(limiter, MemoryLimiter)
    return limiter.in_flight(ONE.key)


class Stubborn:
    """The fixture upstream over stdio, and its record of the calls it ran."""

    def __init__(self, record: Path) -> None:
        self.record = record
        self.upstream = StdioUpstream("stubborn", [sys.executable, "-m", "tests.fixtures.stubborn_server",
                                                   "--record", str(record)], cwd=str(ROOT), era="legacy")

    def notes(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def started(self, tag: str) -> bool:
        return any(n.get("start") == tag for n in self.notes())

    def ended(self, tag: str) -> bool:
        return any(n.get("end") == tag for n in self.notes())

    async def call(self, limiter: Limiter, tag: str, seconds: float, *, timeout: float = 30.0) -> dict[str, Any]:
        """One tools/call under the cap, as the pipeline makes it: the lease around the forward."""
        async with limiter.lease([ONE]):
            return await self.upstream.request("tools/call", {"name": "stubborn",
                                                              "arguments": {"seconds": seconds, "tag": tag}},
                                               timeout=timeout)


async def _ignore(method: str, params: Mapping[str, Any]) -> None:
    return None


@pytest.fixture
async def stubborn(tmp_path: Path) -> AsyncIterator[Stubborn]:
    record = tmp_path / "record.jsonl"
    record.touch()
    server = Stubborn(record)
    await server.upstream.start(_ignore)
    yield server
    await server.upstream.close()


async def until(predicate: Callable[[], Any], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def cancelled_call(stubborn: Stubborn, limiter: Limiter, tag: str, seconds: float) -> None:
    """Start a call, wait until the upstream runs it, then cancel it (``notifications/cancelled``, a hang-up)."""
    task = asyncio.create_task(stubborn.call(limiter, tag, seconds))
    await until(lambda: stubborn.started(tag))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def refused(limiter: Limiter) -> bool:
    try:
        async with limiter.lease([ONE]):
            return False
    except RateLimited:
        return True


async def test_a_cancelled_call_keeps_its_slot_until_the_upstream_answers(limiter: Limiter,
                                                                          stubborn: Stubborn) -> None:
    await cancelled_call(stubborn, limiter, "a", 2.0)
    # The upstream is still running call a: the cap is full, and stays full for as long as it runs.
    assert await in_flight(limiter) == 1
    assert await refused(limiter)
    assert limiter.held_over == 1 and limiter.stats.held_over == 1
    await asyncio.sleep(LEASE_TTL_S * 2)  # past the lease's TTL: the heartbeat keeps it alive while held over
    assert not stubborn.ended("a")
    assert await in_flight(limiter) == 1
    assert await refused(limiter)
    # Its late answer frees the slot, once.
    await until(lambda: stubborn.ended("a"))
    await until(lambda: limiter.held_over == 0)
    await until(lambda: releases(limiter) == 1)
    assert await in_flight(limiter) == 0
    assert stubborn.upstream._rpc.abandoned == 0
    assert (await stubborn.call(limiter, "b", 0.01))["content"][0]["text"] == "done"
    assert releases(limiter) == 2


async def test_cancelling_again_and_again_never_runs_two_calls_upstream(limiter: Limiter,
                                                                        stubborn: Stubborn) -> None:
    await cancelled_call(stubborn, limiter, "first", 1.5)
    for _ in range(5):
        assert await refused(limiter)
    await until(lambda: stubborn.ended("first"))
    await until(lambda: limiter.held_over == 0)
    await cancelled_call(stubborn, limiter, "second", 0.5)
    assert await refused(limiter)
    await until(lambda: limiter.held_over == 0)
    starts = [n["t"] for n in stubborn.notes() if "start" in n]
    ends = [n["t"] for n in stubborn.notes() if "end" in n]
    assert len(starts) == 2 and ends[0] <= starts[1]  # one at a time, upstream too


async def test_a_timed_out_call_keeps_its_slot_for_the_grace_period(limiter: Limiter, stubborn: Stubborn) -> None:
    # The upstream never answers in time; bastion's own timeout (-31003) ends the call, not the upstream's work.
    with pytest.raises(UpstreamTimeout):
        await stubborn.call(limiter, "slow", 60.0, timeout=1.0)
    timed_out = time.monotonic()
    assert await in_flight(limiter) == 1
    assert await refused(limiter)
    # The grace period is the upstream's timeout: past it the slot is freed though the upstream never answered.
    await until(lambda: limiter.held_over == 0, timeout=10)
    assert time.monotonic() - timed_out >= 0.9
    await until(lambda: releases(limiter) == 1)
    assert await in_flight(limiter) == 0
    assert not stubborn.ended("slow")
    assert stubborn.upstream._rpc.abandoned == 0


async def test_the_slot_is_freed_when_the_upstream_process_dies(limiter: Limiter, stubborn: Stubborn) -> None:
    await cancelled_call(stubborn, limiter, "doomed", 60.0)
    assert await refused(limiter)
    pid = stubborn.upstream.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # its work dies with it
    await until(lambda: limiter.held_over == 0, timeout=10)
    await until(lambda: releases(limiter) == 1)
    assert await in_flight(limiter) == 0
    assert stubborn.upstream._rpc.abandoned == 0


async def test_closing_the_upstream_and_the_limiter_release_a_held_over_lease_once(limiter: Limiter,
                                                                                  stubborn: Stubborn) -> None:
    await cancelled_call(stubborn, limiter, "closing", 60.0)
    await stubborn.upstream.close()  # the gateway stopping: the connection's end ends the hold
    await limiter.aclose()
    assert limiter.held_over == 0
    assert await in_flight(limiter) == 0
    assert releases(limiter) == 1


async def test_an_ordinary_call_is_released_at_once_and_leaves_nothing_behind(limiter: Limiter,
                                                                           stubborn: Stubborn) -> None:
    assert (await stubborn.call(limiter, "quick", 0.01))["content"][0]["text"] == "done"
    assert await in_flight(limiter) == 0
    assert limiter.held_over == 0 and limiter.stats.held_over == 0
    assert stubborn.upstream._rpc.abandoned == 0
    # A call cancelled before anything reached the upstream holds nothing over either.
    entered = asyncio.Event()

    async def waits() -> None:
        async with limiter.lease([ONE]):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(waits())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limiter.held_over == 0
    await until(lambda: releases(limiter) == 2)
    assert await in_flight(limiter) == 0


async def test_a_request_abandoned_outside_a_held_call_keeps_nothing(stubborn: Stubborn) -> None:
    """No slot, no hold: a cancelled request of a call with no concurrency cap leaves no timer behind."""
    task = asyncio.create_task(stubborn.upstream.request(
        "tools/call", {"name": "stubborn", "arguments": {"seconds": 1.0, "tag": "free"}}, timeout=30.0))
    await until(lambda: stubborn.started("free"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stubborn.upstream._rpc.abandoned == 0
