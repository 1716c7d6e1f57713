"""A token bucket: a burst, then a steady rate. Used wherever something outside bastion's control could make it
log or audit without bound (the front door's refusals, an upstream's stderr)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TokenBucket"]


@dataclass(slots=True)
class TokenBucket:
    """``capacity`` tokens, refilled at ``rate`` per second. Pure apart from the clock it is given."""

    capacity: float
    rate: float
    tokens: float = field(init=False)
    stamp: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = self.capacity

    def take(self, now: float) -> bool:
        if self.stamp is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
