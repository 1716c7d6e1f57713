"""The limiter contract shared by the Redis and in-memory limiters, and the concurrency lease built on it.

A ``Limiter`` answers two questions for one call: may it start now (``check``, GCRA over every rate limit that
applies, all-or-nothing), and may it run alongside those already in flight (``lease``, an async context manager
that holds one slot of every concurrency cap until the call's work ends, however it ends). The work ends with the
call, unless the call abandoned its upstream request (cancelled, timed out, the client hung up): the upstream may
still be running it, so the slot is held over until the upstream is done (``bastion.holdover``).
"""

from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, MutableMapping, Sequence
from contextvars import Token
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import structlog

from bastion.errors import RateLimited
from bastion.holdover import Abandoned, CallHold, enter_hold, exit_hold
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
    """Counters for the metrics module. ``failed_*`` count calls decided without Redis, per failure mode;
    ``held_over`` counts leases kept past their call because the upstream may still be running it."""

    checks: int = 0
    rejected: int = 0
    failed_open: int = 0
    failed_closed: int = 0
    held_over: int = 0


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
        # Leases whose call ended while the upstream may still run it (``bastion.holdover``), until it is done.
        self._held_over: set[Lease] = set()

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

    def lease(self, caps: Sequence[CapCheck], notes: MutableMapping[str, Any] | None = None) -> Lease:
        """``async with limiter.lease(caps):`` holds one slot of every cap; raises ``RateLimited`` when full.
        ``notes`` (the call record's ``extra``) gets ``held_over``, the caps' names, when the lease outlives the
        call."""
        return Lease(self, tuple(caps), notes)

    @property
    def held_over(self) -> int:
        """Leases held now past their call, for upstream requests that may still be running."""
        return len(self._held_over)

    async def aclose(self) -> None:
        """Release the leases still held over, and wait for pending releases (bounded by the store's timeout)."""
        for lease in list(self._held_over):
            lease.let_go("shutdown")
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
    """One slot of each cap for the duration of a call's work, renewed by a heartbeat so only live work counts.

    Released when the call ends: success, exception, timeout, or cancellation of the caller's task (the client
    went away), unless the call abandoned an upstream request on its way out (``bastion.holdover``): then the
    lease, and its heartbeat, live on until the upstream answers that request, its connection is lost, or the
    grace period ends, whichever comes first. A release interrupted by a second cancellation finishes in the
    background; a release runs once whatever ends the lease.
    """

    __slots__ = ("_caps", "_heartbeat", "_held", "_hold", "_id", "_limiter", "_notes", "_since", "_token")

    def __init__(self, limiter: Limiter, caps: tuple[CapCheck, ...],
                 notes: MutableMapping[str, Any] | None = None) -> None:
        self._limiter = limiter
        self._caps = caps
        self._notes = notes
        self._id = uuid.uuid4().hex
        self._held = False
        self._heartbeat: asyncio.Task[None] | None = None
        self._hold: CallHold | None = None
        self._token: Token[CallHold | None] | None = None
        self._since = 0

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
            # The upstream transport marks this hold if the call abandons a request it forwarded.
            self._hold, self._token = enter_hold()
            self._since = len(self._hold.abandoned)  # a shared hold may list what others abandoned before
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            exit_hold(hold, self._token)
            self._token = None
            waiting = hold.waiting(self._since)
            if waiting and self._held:
                self._hold_over(waiting)
                return
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if not self._held:
            return
        self._held = False
        await asyncio.shield(self._release_in_background())

    def _hold_over(self, waiting: list[Abandoned]) -> None:
        """Keep the slot (and its heartbeat) until the upstream is done with every request the call abandoned."""
        limiter = self._limiter
        limiter._held_over.add(self)
        limiter.stats.held_over += 1
        if self._notes is not None:
            self._notes["held_over"] = [cap.name for cap in self._caps]
        log.info("ratelimit.lease_held_over", caps=[cap.name for cap in self._caps],
                 upstream=waiting[0].upstream, request_id=waiting[0].request_id)
        left = len(waiting)

        def done(reason: str) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                self.let_go(reason)

        for abandoned in waiting:
            abandoned.hold(done)

    def let_go(self, reason: str) -> None:
        """Release a held-over lease now (the upstream is done, or the gateway stops); once, whoever calls."""
        self._limiter._held_over.discard(self)
        if not self._held:
            return
        self._held = False
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        log.info("ratelimit.lease_released", caps=[cap.name for cap in self._caps], reason=reason)
        self._release_in_background()

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
