"""The limiter for a single replica without Redis: same GCRA (the shared pure function), same leases, in a dict.

Exact within one process only. Nothing awaits between reading and writing a bucket, so asyncio tasks cannot
interleave inside a decision, which gives the same atomicity the Lua script gives across replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from bastion.ratelimit.gcra import RateCheck, admit, ttl_us
from bastion.ratelimit.limiter import Acquired, CapCheck, EventHook, Limiter, Verdict

# Expired buckets are swept at most this often (in checks), so memory stays bounded by the active keys.
_SWEEP_EVERY = 1024


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class MemoryLimiter(Limiter):
    """``clock_us`` is injectable so the semantics table can drive this limiter at fixed instants."""

    def __init__(self, *, lease_ttl_s: float = 30.0, on_event: EventHook | None = None,
                 clock_us: Callable[[], int] = _monotonic_us) -> None:
        super().__init__(lease_ttl_s=lease_ttl_s, on_event=on_event)
        self._clock_us = clock_us
        # key -> (tat_us, expires_at_us)
        self._buckets: dict[str, tuple[int, int]] = {}
        # cap key -> lease id -> expires_at_us
        self._leases: dict[str, dict[str, int]] = {}
        self._since_sweep = 0

    async def _check(self, checks: Sequence[RateCheck]) -> Verdict:
        return self.check_at(self._clock_us(), checks)

    def check_at(self, now_us: int, checks: Sequence[RateCheck]) -> Verdict:
        """The synchronous core of ``check``, at an explicit instant (used by the semantics table)."""
        self._maybe_sweep(now_us)
        stored = [self._stored_tat(c.key, now_us) for c in checks]
        result = admit(now_us, stored, checks)
        if result.tripped is not None:
            return Verdict(allowed=False, limit=checks[result.tripped].name, retry_after_ms=result.retry_after_ms)
        for check, tat in zip(checks, result.tats, strict=True):
            assert tat is not None
            self._buckets[check.key] = (tat, now_us + ttl_us(tat, now_us))
        return Verdict(allowed=True)

    def bucket_ttl_us(self, key: str, now_us: int) -> int | None:
        """Remaining life of a bucket (the in-memory twin of Redis ``PTTL``), ``None`` when absent or expired."""
        entry = self._buckets.get(key)
        if entry is None or entry[1] <= now_us:
            return None
        return entry[1] - now_us

    def _stored_tat(self, key: str, now_us: int) -> int | None:
        entry = self._buckets.get(key)
        if entry is None or entry[1] <= now_us:
            return None
        return entry[0]

    def _maybe_sweep(self, now_us: int) -> None:
        self._since_sweep += 1
        if self._since_sweep < _SWEEP_EVERY:
            return
        self._since_sweep = 0
        for key in [k for k, (_, exp) in self._buckets.items() if exp <= now_us]:
            del self._buckets[key]
        for key in [k for k, leases in self._leases.items() if not self._live(leases, now_us)]:
            del self._leases[key]

    @staticmethod
    def _live(leases: dict[str, int], now_us: int) -> dict[str, int]:
        for lease_id in [i for i, exp in leases.items() if exp <= now_us]:
            del leases[lease_id]
        return leases

    async def _acquire(self, caps: Sequence[CapCheck], lease_id: str) -> Acquired:
        now = self._clock_us()
        for i, cap in enumerate(caps):
            if len(self._live(self._leases.setdefault(cap.key, {}), now)) >= cap.max:
                return Acquired(held=False, tripped=i)
        self._put(caps, lease_id, now)
        return Acquired(held=True)

    async def _renew(self, caps: Sequence[CapCheck], lease_id: str) -> None:
        self._put(caps, lease_id, self._clock_us())

    async def _release(self, caps: Sequence[CapCheck], lease_id: str) -> None:
        for cap in caps:
            leases = self._leases.get(cap.key)
            if leases is not None:
                leases.pop(lease_id, None)
                if not leases:
                    del self._leases[cap.key]

    def _put(self, caps: Sequence[CapCheck], lease_id: str, now_us: int) -> None:
        expiry = now_us + int(self.lease_ttl_s * 1_000_000)
        for cap in caps:
            self._leases.setdefault(cap.key, {})[lease_id] = expiry

    def in_flight(self, key: str) -> int:
        """Live leases on a cap key."""
        return len(self._live(self._leases.get(key, {}), self._clock_us()))
