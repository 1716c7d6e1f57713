"""Rate limits and concurrency caps, shared across replicas through Redis or kept in memory for one replica.

The core wires ``build_limiter(RateLimitConfig.from_mapping(...), redis_client)`` into a
``bastion.ratelimit.guard.RateLimitGuard``.
"""

from bastion.ratelimit.config import RateLimitConfig
from bastion.ratelimit.factory import build_limiter
from bastion.ratelimit.limiter import CapCheck, EventHook, Limiter, LimiterEvent, LimiterStats, Verdict

__all__ = ["CapCheck", "EventHook", "Limiter", "LimiterEvent", "LimiterStats", "RateLimitConfig", "Verdict",
           "build_limiter"]
