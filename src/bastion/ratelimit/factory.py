"""Which limiter a gateway gets: shared in Redis when one is configured, in memory otherwise."""

from __future__ import annotations

from redis.asyncio import Redis

from bastion.ratelimit.config import RateLimitConfig
from bastion.ratelimit.limiter import EventHook, Limiter
from bastion.ratelimit.memory import MemoryLimiter
from bastion.ratelimit.redis_limiter import RedisLimiter
from bastion.ratelimit.scripts import ScriptClient


def build_limiter(cfg: RateLimitConfig, redis_client: Redis | None, *,
                  on_event: EventHook | None = None, scripts: ScriptClient | None = None) -> Limiter:
    """The caller owns ``redis_client`` and ``scripts`` (and closes them); build the first with
    ``cfg.redis_client_kwargs()``, the second (the lean client that runs the scripts) with the same options."""
    if redis_client is None:
        return MemoryLimiter(lease_ttl_s=cfg.lease_ttl_s, on_event=on_event)
    return RedisLimiter(redis_client, key_prefix=cfg.key_prefix, failure_mode=cfg.failure_mode,
                        timeout_s=cfg.timeout_s, lease_ttl_s=cfg.lease_ttl_s, on_event=on_event,
                        scripts=scripts)
