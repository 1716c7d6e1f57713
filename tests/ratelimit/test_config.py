from __future__ import annotations

from typing import Any

import pytest

from bastion.errors import ConfigError
from bastion.ratelimit import RateLimitConfig
from bastion.ratelimit.model import ConcurrencySpec, Rate, RateLimitSpec


def test_full_section() -> None:
    cfg = RateLimitConfig.from_mapping({
        "failure_mode": "open",
        "timeout": "50ms",
        "key_prefix": "acme:rl",
        "lease_ttl": "30s",
        "redis_client": "redis-py",
        "defaults": [
            {"name": "per-principal", "rate": "60/minute", "burst": 10, "per": "principal"},
            {"name": "everyone", "rate": "1000/hour", "per": "global"},
        ],
        "concurrency": [{"name": "inflight", "max": 4, "per": "upstream"}],
    })
    assert cfg.failure_mode == "open"
    assert cfg.timeout_s == pytest.approx(0.05)
    assert cfg.key_prefix == "acme:rl"
    assert cfg.lease_ttl_s == 30.0
    assert cfg.redis_client == "redis-py"
    assert cfg.defaults == (
        RateLimitSpec(name="per-principal", scope="principal", rate=Rate(60, 60.0), burst=10),
        RateLimitSpec(name="everyone", scope="global", rate=Rate(1000, 3600.0)),
    )
    assert cfg.concurrency == (ConcurrencySpec(name="inflight", scope="upstream", max=4),)
    kwargs = cfg.redis_client_kwargs()
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (pytest.approx(0.05), pytest.approx(0.05))
    assert kwargs["retry"].get_retries() == 1  # a stale pooled connection must not refuse a call


def test_defaults_when_absent() -> None:
    assert RateLimitConfig.from_mapping(None) == RateLimitConfig()
    cfg = RateLimitConfig.from_mapping({})
    assert (cfg.failure_mode, cfg.timeout_s, cfg.key_prefix, cfg.lease_ttl_s, cfg.redis_client) == (
        "closed", 0.25, "bastion:rl", 30.0, "fast")


@pytest.mark.parametrize(("data", "path", "fragment"), [
    ({"mode": "open"}, "rate_limits.mode", "unknown key"),
    ({"failure_mode": "sometimes"}, "rate_limits.failure_mode", "closed' or 'open"),
    ({"redis_client": "hiredis"}, "rate_limits.redis_client", "'fast' or 'redis-py', got 'hiredis'"),
    ({"timeout": "fast"}, "rate_limits.timeout", "duration"),
    ({"timeout": 0}, "rate_limits.timeout", "positive"),
    ({"lease_ttl": "10ms"}, "rate_limits.lease_ttl", "at least"),
    ({"key_prefix": "has space"}, "rate_limits.key_prefix", "key_prefix"),
    ({"defaults": {"name": "x"}}, "rate_limits.defaults", "list"),
    ({"defaults": [{"rate": "1/s"}]}, "rate_limits.defaults[0].name", "name is required"),
    ({"defaults": [{"name": "a b", "rate": "1/s"}]}, "rate_limits.defaults[0].name", "name is required"),
    ({"defaults": [{"name": "x"}]}, "rate_limits.defaults[0].rate", "rate is required"),
    ({"defaults": [{"name": "x", "rate": "often"}]}, "rate_limits.defaults[0].rate", "invalid rate"),
    ({"defaults": [{"name": "x", "rate": "0/s"}]}, "rate_limits.defaults[0].rate", "positive"),
    ({"defaults": [{"name": "x", "rate": "1/s", "burst": 0}]}, "rate_limits.defaults[0].burst", "positive"),
    ({"defaults": [{"name": "x", "rate": "1/s", "burst": True}]}, "rate_limits.defaults[0].burst", "positive"),
    ({"defaults": [{"name": "x", "rate": "1/s", "per": "tool"}]}, "rate_limits.defaults[0].per", "per must"),
    ({"defaults": [{"name": "x", "rate": "1/s", "cost": 2}]}, "rate_limits.defaults[0].cost", "unknown key"),
    ({"defaults": [{"name": "x", "rate": "1/s"}, {"name": "x", "rate": "2/s"}]}, "rate_limits.defaults[1].name",
     "duplicate"),
    ({"concurrency": [{"name": "c"}]}, "rate_limits.concurrency[0].max", "max is required"),
    ({"concurrency": [{"name": "c", "max": -1}]}, "rate_limits.concurrency[0].max", "positive"),
    ({"concurrency": [{"name": "c", "max": 1, "per": "global"}]}, "rate_limits.concurrency[0].per", "per must"),
])
def test_errors_name_the_key(data: dict[str, Any], path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        RateLimitConfig.from_mapping(data)
    assert info.value.path == path
    assert fragment in info.value.message


def test_section_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError) as info:
        RateLimitConfig.from_mapping(["x"], path="gateway.rate_limits")  # type: ignore[arg-type]
    assert info.value.path == "gateway.rate_limits"


@pytest.mark.parametrize(("text", "expected"), [("50ms", 0.05), ("2s", 2.0), ("1m", 60.0), (1.5, 1.5), ("3", 3.0)])
def test_durations(text: object, expected: float) -> None:
    assert RateLimitConfig.from_mapping({"timeout": text}).timeout_s == pytest.approx(expected)
