"""The limiter contract shared by the Redis and in-memory limiters, and the concurrency lease built on it.

A ``Limiter`` answers two questions for one call: may it start now (``check``, GCRA over every rate limit that
applies, all-or-nothing), and may it run alongside those already in flight (``lease``, an async context manager
that holds one slot of every concurrency cap until the call ends, however it ends).
"""

from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import structlog

from bastion.errors import RateLimited
from bastion.ratelimit.gcra import RateCheck

log = structlog.get_logger("bastion.ratelimit")

# A full concurrency cap frees up when some call ends, which nobody can predict; this is the hint clients get.
CONCURRENCY_RETRY_AFTER_MS = 1000

LimiterEvent = Literal["rejected", "failed_open", "failed_closed", "redis_unavailable", "redis_recovered"]
# Called with the event and the limit it concerns (``rejected`` only). Must not block or raise.
EventHook = Callable[[LimiterEvent, str | None], None]


@dataclass(frozen=True, slots=True)
class CapCheck:
    """One concurrency cap applied to one call: at most ``max`` leases on ``key`` at once."""

    name: str
    key: str
    max: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer to ``Limiter.check``. ``degraded`` means Redis was unreachable and ``failure_mode`` is open."""

    allowed: bool
    limit: str | None = None
    retry_after_ms: int = 0
    degraded: bool = False

    def raise_if_refused(self) -> None:
        if not self.allowed:
            raise RateLimited(self.limit or "unknown", self.retry_after_ms)


@dataclass(slots=True)
class LimiterStats:
    """Counters for the metrics module. ``failed_*`` count calls decided without Redis, per failure mode."""

    checks: int = 0
    rejected: int = 0
    failed_open: int = 0
    failed_closed: int = 0


@dataclass(frozen=True, slots=True)
class Acquired:
    """Outcome of taking leases: ``tripped`` is the index of the full cap; ``held`` is False when nothing needs
    releasing (refused, or Redis unreachable in open mode)."""

    held: bool
    tripped: int | None = None


class Limiter(ABC):
    """Base of both limiters: counting, events and the lease life cycle; subclasses supply the storage."""

    def __init__(self, *, lease_ttl_s: float = 30.0, on_event: EventHook | None = None) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.stats = LimiterStats()
        self._on_event = on_event
        # Releases that outlive a cancelled caller; kept referenced so they are not garbage-collected mid-flight.
        self._background: set[asyncio.Task[None]] = set()

    @property
    def healthy(self) -> bool:
        """False while the backing store is unreachable."""
        return True

    async def check(self, checks: Sequence[RateCheck]) -> Verdict:
        """Consume ``cost`` from every check's bucket if all allow it; otherwise consume nothing."""
        if not checks:
            return Verdict(allowed=True)
        self.stats.checks += 1
        verdict = await self._check(checks)
        if not verdict.allowed:
            self._rejected(verdict.limit)
        return verdict

    def lease(self, caps: Sequence[CapCheck]) -> Lease:
        """``async with limiter.lease(caps):`` holds one slot of every cap; raises ``RateLimited`` when full."""
        return Lease(self, tuple(caps))

    async def aclose(self) -> None:
        """Wait for pending releases (bounded by the store's own timeout)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def _emit(self, event: LimiterEvent, limit: str | None = None) -> None:
        if self._on_event is not None:
            self._on_event(event, limit)

    def _rejected(self, limit: str | None) -> None:
        self.stats.rejected += 1
        self._emit("rejected", limit)

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @abstractmethod
    async def _check(self, checks: Sequence[RateCheck]) -> Verdict: ...

    @abstractmethod
    async def _acquire(self, caps: Sequence[CapCheck], lease_id: str) -> Acquired: ...

    @abstractmethod
    async def _renew(self, caps: Sequence[CapCheck], lease_id: str) -> None:
        """Extend the lease; never raises (a failed renewal is retried at the next beat)."""

    @abstractmethod
    async def _release(self, caps: Sequence[CapCheck], lease_id: str) -> None:
        """Drop the lease; never raises (an unreleased lease expires after ``lease_ttl_s``)."""


class Lease:
    """One slot of each cap for the duration of a call, renewed by a heartbeat so that only live calls count.

    Released on any exit: success, exception, timeout, or cancellation of the caller's task (the client went
    away). A release interrupted by a second cancellation finishes in the background.
    """

    def __init__(self, limiter: Limiter, caps: tuple[CapCheck, ...]) -> None:
        self._limiter = limiter
        self._caps = caps
        self._id = uuid.uuid4().hex
        self._held = False
        self._heartbeat: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Lease:
        if not self._caps:
            return self
        try:
            acquired = await self._limiter._acquire(self._caps, self._id)
        except BaseException:
            # Cancelled or timed out while Redis may already have run the script: drop the lease it may hold.
            self._release_in_background()
            raise
        if not acquired.held and acquired.tripped is None:
            self._release_in_background()  # unreachable store (fail-open): same doubt, same remedy
        if acquired.tripped is not None:
            cap = self._caps[acquired.tripped]
            self._limiter._rejected(cap.name)
            raise RateLimited(cap.name, CONCURRENCY_RETRY_AFTER_MS, detail={"kind": "concurrency"})
        self._held = acquired.held
        if self._held:
            self._heartbeat = asyncio.create_task(self._beat(), name=f"bastion-lease-{self._id}")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if not self._held:
            return
        self._held = False
        await asyncio.shield(self._release_in_background())

    def _release_in_background(self) -> asyncio.Task[None]:
        release = asyncio.create_task(self._limiter._release(self._caps, self._id))
        self._limiter._keep(release)
        return release

    async def _beat(self) -> None:
        interval = self._limiter.lease_ttl_s / 3
        # ``_held`` ends the loop too, not only the cancellation from ``__aexit__``: a cancellation dropped inside
        # ``_renew`` (bastion.stopping: asyncio.wait_for on Python 3.11) would otherwise renew a released lease,
        # and hold its slot, for as long as the process lives.
        while self._held:
            await asyncio.sleep(interval)
            if self._held:
                await self._limiter._renew(self._caps, self._id)
