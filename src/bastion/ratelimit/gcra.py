"""GCRA arithmetic, pure. ``gcra.lua`` is a line-by-line port of ``admit``; both are tested against one table.

Each bucket is one number, its theoretical arrival time (TAT): the instant at which the bucket would be full
again. A call of cost ``c`` at ``now`` moves it to ``max(TAT, now) + c * emission``; the call is admitted when
that lies no more than ``burst * emission`` ahead of ``now``. Everything is in integer microseconds so the Lua
port (Lua 5.1 numbers are doubles, exact for integers below 2**53) computes bit-identical results.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bastion.ratelimit.model import RateLimitSpec

US_PER_S = 1_000_000


@dataclass(frozen=True, slots=True)
class RateCheck:
    """One limit applied to one call: which bucket (``key``), how fast it drains, how much the call costs."""

    name: str
    key: str
    emission_us: int
    burst: int
    cost: int = 1

    @classmethod
    def from_spec(cls, spec: RateLimitSpec, key: str, cost: int = 1) -> RateCheck:
        return cls(name=spec.name, key=key, emission_us=emission_interval_us(spec), burst=spec.effective_burst,
                   cost=cost)


def emission_interval_us(spec: RateLimitSpec) -> int:
    # Rounded up: a limit may come out a hair stricter than declared, never looser.
    return max(1, math.ceil(spec.rate.period_s * US_PER_S / spec.rate.count))


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome for all the checks of one call.

    ``tripped`` is the index of the check that refused (the one with the longest wait, so that retrying after
    ``retry_after_us`` passes every limit), or ``None``. ``tats`` holds the new TAT per check when admitted
    (``None`` entries when refused: nothing is consumed).
    """

    allowed: bool
    tripped: int | None
    retry_after_us: int
    tats: tuple[int | None, ...]

    @property
    def retry_after_ms(self) -> int:
        return -(-self.retry_after_us // 1000)


def admit(now_us: int, stored_tats: Sequence[int | None], checks: Sequence[RateCheck]) -> Admission:
    """Decide every check against its stored TAT; all-or-nothing."""
    new_tats: list[int] = []
    worst: int | None = None
    worst_retry = 0
    for i, check in enumerate(checks):
        stored = stored_tats[i]
        tat = stored if stored is not None and stored > now_us else now_us
        new_tat = tat + check.emission_us * check.cost
        allow_at = new_tat - check.emission_us * check.burst
        if allow_at > now_us and allow_at - now_us > worst_retry:
            worst, worst_retry = i, allow_at - now_us
        new_tats.append(new_tat)
    if worst is not None:
        return Admission(allowed=False, tripped=worst, retry_after_us=worst_retry, tats=(None,) * len(checks))
    return Admission(allowed=True, tripped=None, retry_after_us=0, tats=tuple(new_tats))


def ttl_us(new_tat: int, now_us: int) -> int:
    """How long a bucket must be kept: until it is full again (then a missing key means the same)."""
    return max(1, new_tat - now_us)
