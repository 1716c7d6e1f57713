"""The limiter shared by every replica: one Lua script per decision, the Redis clock, a declared failure mode.

Every Redis call is bounded by ``timeout`` (on top of the client's socket timeouts). When Redis cannot answer
in time, ``failure_mode`` decides: ``closed`` refuses the call with ``LimiterUnavailable``, ``open`` lets it
through uncounted. Each call tries Redis again, so service resumes on its own when Redis is back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar, cast

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from bastion.deadlines import Deadlines
from bastion.errors import LimiterUnavailable
from bastion.ratelimit.gcra import RateCheck
from bastion.ratelimit.limiter import Acquired, CapCheck, EventHook, Limiter, Verdict
from bastion.ratelimit.scripts import GCRA, LEASE_ACQUIRE, LEASE_RELEASE, LEASE_RENEW, Script, ScriptClient

log = structlog.get_logger("bastion.ratelimit")

FailureMode = Literal["closed", "open"]
T = TypeVar("T")

# What "Redis did not answer" looks like from redis-py and asyncio; anything else is a bug and propagates.
_UNREACHABLE = (RedisError, OSError, TimeoutError)


class _Unreachable(Exception):
    pass


class _Health:
    """Tracks outages so that each is logged once when it starts and once when it ends, not per call."""

    def __init__(self, failure_mode: FailureMode, emit: Callable[[Any], None]) -> None:
        self.healthy = True
        self._failure_mode = failure_mode
        self._emit = emit
        self._since = 0.0
        self._failures = 0

    def down(self, exc: BaseException) -> None:
        self._failures += 1
        if not self.healthy:
            return
        self.healthy = False
        self._since = time.monotonic()
        log.warning("ratelimit.redis_unavailable", failure_mode=self._failure_mode, error=type(exc).__name__,
                    detail=str(exc)[:200])
        self._emit("redis_unavailable")

    def up(self) -> None:
        if self.healthy:
            return
        log.info("ratelimit.redis_recovered", outage_s=round(time.monotonic() - self._since, 3),
                 failed_calls=self._failures)
        self.healthy = True
        self._failures = 0
        self._emit("redis_recovered")


def hash_tagged(prefix: str) -> str:
    """``prefix`` as a Redis Cluster hash tag (``{bastion:rl}``), unless it already holds a non-empty one.

    One script call reads and writes every bucket of a call (all-or-nothing across the limits) or every cap of a
    lease set, and a Cluster runs a script only when all its keys hash to one slot. The global and per-upstream
    buckets are shared by every principal, so the buckets linked by "checked in one call" form one connected set:
    no finer tag than the whole limiter keeps each call's keys together. The components after the tag are
    percent-encoded (braces included), so no principal or tool name can move a key to another slot.
    """
    start = prefix.find("{")
    if start >= 0 and prefix.find("}", start) > start + 1:
        return prefix
    return "{" + prefix + "}"


class RedisLimiter(Limiter):
    """``client`` should be built with ``RateLimitConfig.redis_client_kwargs()`` (timeouts, one retry).

    ``scripts`` runs the scripts (every decision, and each lease's acquisition, renewal and release) when given:
    the lean client of ``bastion.resp`` on the same server, which costs a fraction of redis-py's per call. All of
    the limiter's traffic then goes through it, so one client's failure behaviour decides every call.
    """

    def __init__(self, client: Redis, *, key_prefix: str = "bastion:rl", failure_mode: FailureMode = "closed",
                 timeout_s: float = 0.05, lease_ttl_s: float = 30.0, on_event: EventHook | None = None,
                 scripts: ScriptClient | None = None) -> None:
        super().__init__(lease_ttl_s=lease_ttl_s, on_event=on_event)
        # redis-py's Redis satisfies ScriptClient at run time; its stubs type evalsha's result as sync-or-async.
        self._scripts: ScriptClient = scripts if scripts is not None else cast(ScriptClient, client)
        self._prefix = hash_tagged(key_prefix)
        self._failure_mode = failure_mode
        self._timeout_s = timeout_s
        self._deadlines = Deadlines()  # one timer for every script's deadline (bastion.deadlines)
        self._health = _Health(failure_mode, self._emit)
        self._gcra = Script(GCRA)
        self._acquire_script = Script(LEASE_ACQUIRE)
        self._renew_script = Script(LEASE_RENEW)
        self._release_script = Script(LEASE_RELEASE)

    @property
    def healthy(self) -> bool:
        return self._health.healthy

    @property
    def failure_mode(self) -> FailureMode:
        return self._failure_mode

    def rate_key(self, key: str) -> str:
        return f"{self._prefix}:{key}"

    def cap_key(self, key: str) -> str:
        # A separate branch of the namespace: a cap and a rate limit may share a name, never a key.
        return f"{self._prefix}:cc:{key}"

    async def load_scripts(self) -> None:
        """Optional warm-up at startup; scripts are (re)loaded on demand anyway."""
        for script in (self._gcra, self._acquire_script, self._renew_script, self._release_script):
            await self._guarded(lambda s=script: s.load(self._scripts))  # type: ignore[misc]

    async def measure(self) -> bool:
        """Whether Redis answers the limiter now, found by one real operation (loading its scripts) that moves
        its health like any decision would: a failure starts an outage (``redis_unavailable``). At start-up it
        is what the limiter's health gauges start from."""
        with contextlib.suppress(_Unreachable):
            await self.load_scripts()
        return self.healthy

    async def _check(self, checks: Sequence[RateCheck]) -> Verdict:
        keys = [self.rate_key(c.key) for c in checks]
        args: list[str | int] = [""]
        for c in checks:
            args += [c.emission_us, c.burst, c.cost]
        try:
            allowed, tripped, retry_us, _now = await self._guarded(lambda: self._gcra(self._scripts, keys, args))
        except _Unreachable as exc:
            self._degrade(exc)
            return Verdict(allowed=True, degraded=True)
        if allowed:
            return Verdict(allowed=True)
        return Verdict(allowed=False, limit=checks[int(tripped) - 1].name, retry_after_ms=-(-int(retry_us) // 1000))

    async def _acquire(self, caps: Sequence[CapCheck], lease_id: str) -> Acquired:
        keys = [self.cap_key(c.key) for c in caps]
        args: list[str | int] = [lease_id, self._ttl_ms, *(c.max for c in caps)]
        try:
            tripped = await self._guarded(lambda: self._acquire_script(self._scripts, keys, args))
        except _Unreachable as exc:
            self._degrade(exc)
            return Acquired(held=False)
        if int(tripped):
            return Acquired(held=False, tripped=int(tripped) - 1)
        return Acquired(held=True)

    async def _renew(self, caps: Sequence[CapCheck], lease_id: str) -> None:
        keys = [self.cap_key(c.key) for c in caps]
        # On failure: already logged as an outage; the next beat retries, and the lease re-appears if needed.
        with contextlib.suppress(_Unreachable):
            await self._guarded(lambda: self._renew_script(self._scripts, keys, [lease_id, self._ttl_ms]))

    async def _release(self, caps: Sequence[CapCheck], lease_id: str) -> None:
        keys = [self.cap_key(c.key) for c in caps]
        # On failure the lease expires after lease_ttl, its heartbeat being gone.
        with contextlib.suppress(_Unreachable):
            await self._guarded(lambda: self._release_script(self._scripts, keys, [lease_id]))

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.lease_ttl_s * 1000))

    async def _guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            with self._deadlines.after(self._timeout_s):
                result = await call()
        except _UNREACHABLE as exc:
            if isinstance(exc, TimeoutError) and not str(exc):
                # asyncio's own timeout says nothing; the log line and the error detail should.
                exc = TimeoutError(f"no answer within {self._timeout_s:g} s")
            self._health.down(exc)
            raise _Unreachable(f"{type(exc).__name__}: {exc}") from exc
        self._health.up()
        return result

    def _degrade(self, exc: _Unreachable) -> None:
        """Apply the failure mode to a call Redis could not decide: return to let it through, or raise."""
        if self._failure_mode == "open":
            self.stats.failed_open += 1
            self._emit("failed_open")
            return
        self.stats.failed_closed += 1
        self._emit("failed_closed")
        raise LimiterUnavailable(log_detail=str(exc)) from None
