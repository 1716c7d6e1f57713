"""What a limit is, as declared in config and policy files. Pure data; no I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from bastion.call import Handoff
from bastion.errors import ConfigError
from bastion.protocol.methods import FORWARDED

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
    """A rate limit. ``burst`` is how much cost may be spent at once (defaults to ``rate.count``).

    ``methods``: the forwarded requests it counts (``protocol.methods.FORWARDED``); ``None``, all of them.
    """

    name: str
    scope: Scope
    rate: Rate
    burst: int | None = None
    methods: frozenset[str] | None = None

    @property
    def effective_burst(self) -> int:
        return self.burst if self.burst is not None else self.rate.count


@dataclass(frozen=True, slots=True)
class ConcurrencySpec:
    """At most ``max`` requests in flight at once per ``scope`` key; ``methods`` as for ``RateLimitSpec``."""

    name: str
    scope: ConcurrencyScope
    max: int
    methods: frozenset[str] | None = None


Spec = TypeVar("Spec", RateLimitSpec, ConcurrencySpec)


def for_method(specs: tuple[Spec, ...], method: str) -> tuple[Spec, ...]:
    """The specs that count ``method``: ``specs`` itself when all do (the common case, nothing is copied)."""
    if all(s.methods is None or method in s.methods for s in specs):
        return specs
    return tuple(s for s in specs if s.methods is None or method in s.methods)


@dataclass(frozen=True, slots=True)
class Allowance:
    """What the policy attached to a call it allowed, for the rate-limit guard: the limits and concurrency caps of
    the rules that allowed it, and the tool's cost weight."""

    limits: tuple[RateLimitSpec, ...] = ()
    concurrency: tuple[ConcurrencySpec, ...] = ()
    cost: int = 1


# Put on the call's record by the policy guard, read by the rate-limit guard after it.
ALLOWANCE: Handoff[Allowance] = Handoff("ratelimit.allowance", Allowance())

# Limit names end up inside Redis keys and JSON-RPC error data, so they stay short and plain.
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SCOPES: tuple[Scope, ...] = ("principal", "principal_tool", "upstream", "global")
_CONCURRENCY_SCOPES: tuple[ConcurrencyScope, ...] = ("principal", "upstream")


def _item(data: Any, path: str, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError("expected a mapping", path=path)
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise ConfigError(f"unknown key(s): {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}",
                          path=f"{path}.{unknown[0]}")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError("name is required: 1-64 characters of letters, digits, '_', '.', '-'", path=f"{path}.name")
    return data


def _positive_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"expected a positive integer, got {value!r}", path=path)
    return value


def parse_methods(value: Any, path: str) -> frozenset[str] | None:
    """A limit item's ``methods``: a non-empty list of forwarded request methods; absent, all of them."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise ConfigError(f"methods must be a non-empty list of {', '.join(FORWARDED)}", path=path)
    for i, method in enumerate(value):
        if method not in FORWARDED:
            raise ConfigError(f"methods: {method!r} is not a request bastion forwards; expected one of "
                              f"{', '.join(FORWARDED)}", path=f"{path}[{i}]")
    return frozenset(value)


def parse_limit(data: Any, path: str) -> RateLimitSpec:
    """One ``{name, rate, burst?, per, methods?}`` item, as written in the gateway config and in policy rules."""
    item = _item(data, path, frozenset({"name", "rate", "burst", "per", "methods"}))
    rate_text = item.get("rate")
    if not isinstance(rate_text, str):
        raise ConfigError("rate is required, e.g. '60/minute'", path=f"{path}.rate")
    try:
        rate = parse_rate(rate_text)
    except ConfigError as exc:
        raise ConfigError(exc.message, path=f"{path}.rate") from None
    burst = _positive_int(item["burst"], f"{path}.burst") if item.get("burst") is not None else None
    per = item.get("per", "principal")
    if per not in _SCOPES:
        raise ConfigError(f"per must be one of {', '.join(_SCOPES)}, got {per!r}", path=f"{path}.per")
    return RateLimitSpec(name=item["name"], scope=per, rate=rate, burst=burst,
                         methods=parse_methods(item.get("methods"), f"{path}.methods"))


def parse_concurrency(data: Any, path: str) -> ConcurrencySpec:
    """One ``{name, max, per, methods?}`` item, as written in the gateway config and in policy rules."""
    item = _item(data, path, frozenset({"name", "max", "per", "methods"}))
    if "max" not in item:
        raise ConfigError("max is required", path=f"{path}.max")
    maximum = _positive_int(item["max"], f"{path}.max")
    per = item.get("per", "principal")
    if per not in _CONCURRENCY_SCOPES:
        raise ConfigError(f"per must be one of {', '.join(_CONCURRENCY_SCOPES)}, got {per!r}", path=f"{path}.per")
    return ConcurrencySpec(name=item["name"], scope=per, max=maximum,
                           methods=parse_methods(item.get("methods"), f"{path}.methods"))
