"""What a limit is, as declared in config and policy files. Pure data; no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from bastion.errors import ConfigError

Scope = Literal["principal", "principal_tool", "upstream", "global"]
ConcurrencyScope = Literal["principal", "upstream"]

_UNITS = {"second": 1.0, "sec": 1.0, "s": 1.0, "minute": 60.0, "min": 60.0, "m": 60.0,
          "hour": 3600.0, "h": 3600.0, "day": 86400.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*$")


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` units of cost per ``period_s`` seconds."""

    count: int
    period_s: float

    def __str__(self) -> str:
        return f"{self.count}/{self.period_s:g}s"


def parse_rate(text: str) -> Rate:
    """Parse ``60/minute``, ``10/s``, ``1000/hour``, ``5/10s``."""
    m = _RATE.match(text.lower())
    if not m or m.group(3) not in _UNITS:
        raise ConfigError(f"invalid rate {text!r}; expected e.g. '60/minute', '10/second', '5/10s'")
    count = int(m.group(1))
    mult = int(m.group(2)) if m.group(2) else 1
    if count <= 0 or mult <= 0:
        raise ConfigError(f"invalid rate {text!r}; count and period must be positive")
    return Rate(count=count, period_s=mult * _UNITS[m.group(3)])


@dataclass(frozen=True, slots=True)
class RateLimitSpec:
    """A rate limit. ``burst`` is how much cost may be spent at once (defaults to ``rate.count``)."""

    name: str
    scope: Scope
    rate: Rate
    burst: int | None = None

    @property
    def effective_burst(self) -> int:
        return self.burst if self.burst is not None else self.rate.count


@dataclass(frozen=True, slots=True)
class ConcurrencySpec:
    """At most ``max`` calls in flight at once per ``scope`` key."""

    name: str
    scope: ConcurrencyScope
    max: int
