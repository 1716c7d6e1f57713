"""The ``rate_limits`` section of the gateway config."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bastion.errors import ConfigError
from bastion.ratelimit.model import ConcurrencySpec, RateLimitSpec, parse_concurrency, parse_limit
from bastion.ratelimit.redis_limiter import FailureMode
from bastion.redisconn import limiter_options
from bastion.units import parse_duration

_KEYS = frozenset({"failure_mode", "timeout", "key_prefix", "defaults", "concurrency", "lease_ttl", "redis_client"})
# The limiter's scripts on one Redis server: the lean client of bastion.resp, or redis-py's (the escape hatch).
RedisClientKind = Literal["fast", "redis-py"]
_PREFIX = re.compile(r"^[A-Za-z0-9_.:{}-]{1,64}$")


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    failure_mode: FailureMode = "closed"
    timeout_s: float = 0.25
    key_prefix: str = "bastion:rl"
    defaults: tuple[RateLimitSpec, ...] = ()
    concurrency: tuple[ConcurrencySpec, ...] = ()
    lease_ttl_s: float = 30.0
    redis_client: RedisClientKind = "fast"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, path: str = "rate_limits") -> RateLimitConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", path=path)
        unknown = sorted(str(k) for k in data if k not in _KEYS)
        if unknown:
            raise ConfigError(f"unknown key(s): {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}",
                              path=f"{path}.{unknown[0]}")
        mode = data.get("failure_mode", "closed")
        if mode not in ("closed", "open"):
            raise ConfigError(f"failure_mode must be 'closed' or 'open', got {mode!r}", path=f"{path}.failure_mode")
        prefix = data.get("key_prefix", "bastion:rl")
        if not isinstance(prefix, str) or not _PREFIX.match(prefix):
            raise ConfigError("key_prefix must be 1-64 characters of letters, digits and _.:{}-",
                              path=f"{path}.key_prefix")
        client = data.get("redis_client", "fast")
        if client not in ("fast", "redis-py"):
            raise ConfigError(f"redis_client must be 'fast' or 'redis-py', got {client!r}",
                              path=f"{path}.redis_client")
        timeout_s = parse_duration(data.get("timeout", 0.25), f"{path}.timeout")
        lease_ttl_s = parse_duration(data.get("lease_ttl", 30.0), f"{path}.lease_ttl")
        if lease_ttl_s < 0.1:
            raise ConfigError("lease_ttl must be at least 100ms", path=f"{path}.lease_ttl")
        defaults = tuple(parse_limit(item, f"{path}.defaults[{i}]")
                         for i, item in enumerate(_list(data.get("defaults"), f"{path}.defaults")))
        concurrency = tuple(parse_concurrency(item, f"{path}.concurrency[{i}]")
                            for i, item in enumerate(_list(data.get("concurrency"), f"{path}.concurrency")))
        _unique([s.name for s in defaults], f"{path}.defaults")
        _unique([s.name for s in concurrency], f"{path}.concurrency")
        return cls(failure_mode=mode, timeout_s=timeout_s, key_prefix=prefix, defaults=defaults,
                   concurrency=concurrency, lease_ttl_s=lease_ttl_s, redis_client=client)

    def redis_client_kwargs(self) -> dict[str, Any]:
        """Options for the ``redis.asyncio.Redis`` the limiter is given: socket timeouts matching ``timeout``, and
        the one immediate retry that keeps a stale pooled connection from refusing a call (see ``redisconn``)."""
        return limiter_options(self.timeout_s).kwargs()


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError("expected a list", path=path)
    return value


def _unique(names: list[str], path: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ConfigError(f"duplicate limit name {name!r}", path=f"{path}[{i}].name")
        seen.add(name)


