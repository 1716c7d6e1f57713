"""The rate-limit step of the tools/call pipeline (the other forwarded requests: ``ratelimit.forwarded``).

Runs after the policy guard, so only authorised attempts count. Concurrency leases are taken first and rate
buckets consumed second: a call refused for concurrency then costs no rate, and a call refused by rate gives
its lease back as soon as the pipeline unwinds ``cleanup``.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import TypeVar

from bastion.call import CallContext, CallRecord
from bastion.errors import LimiterUnavailable, RateLimited
from bastion.protocol.methods import TOOLS_CALL
from bastion.ratelimit.config import RateLimitConfig
from bastion.ratelimit.gcra import RateCheck
from bastion.ratelimit.keys import bucket_key
from bastion.ratelimit.limiter import CapCheck, Limiter
from bastion.ratelimit.model import ALLOWANCE, ConcurrencyScope, ConcurrencySpec, RateLimitSpec, Scope, for_method

S = TypeVar("S", RateLimitSpec, ConcurrencySpec)


def merge_by_name(defaults: Iterable[S], attached: Iterable[S]) -> list[S]:
    """Defaults, then policy-attached limits; a policy limit replaces a default of the same name."""
    merged: dict[str, S] = {s.name: s for s in defaults}
    for spec in attached:
        merged[spec.name] = spec
    return list(merged.values())


def rate_checks(ctx: CallContext, record: CallRecord, cfg: RateLimitConfig) -> list[RateCheck]:
    allowance = record.get(ALLOWANCE)
    return [RateCheck.from_spec(spec, _key(spec.name, spec.scope, ctx), cost=allowance.cost)
            for spec in merge_by_name(cfg.defaults, allowance.limits)]


def cap_checks(ctx: CallContext, record: CallRecord, cfg: RateLimitConfig) -> list[CapCheck]:
    return [CapCheck(name=spec.name, key=_key(spec.name, spec.scope, ctx), max=spec.max)
            for spec in merge_by_name(cfg.concurrency, record.get(ALLOWANCE).concurrency)]


def _key(name: str, scope: Scope | ConcurrencyScope, ctx: CallContext) -> str:
    return bucket_key(name, scope, principal=ctx.principal.id, tool=ctx.tool.public_name, upstream=ctx.tool.upstream)


class RateLimitGuard:
    name = "ratelimit"

    def __init__(self, limiter: Limiter, cfg: RateLimitConfig) -> None:
        self._limiter = limiter
        # The defaults that count tools/call, chosen once here: a call pays nothing for limits of other methods
        # (``methods``). The policy's are chosen where its decision is made and kept (``PolicySet.decide``).
        self._cfg = replace(cfg, defaults=for_method(cfg.defaults, TOOLS_CALL),
                            concurrency=for_method(cfg.concurrency, TOOLS_CALL))

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None:
        cfg, allowance = self._cfg, record.get(ALLOWANCE)
        if not (cfg.defaults or cfg.concurrency or allowance.limits or allowance.concurrency):
            return  # no limit applies: nothing to lease, nothing to count (the limiter would answer "allowed")
        try:
            caps = cap_checks(ctx, record, self._cfg)
            if caps:
                # The record's ``extra`` hears when the lease outlives the call (``held_over``, see the lease).
                await cleanup.enter_async_context(self._limiter.lease(caps, record.extra))
            verdict = await self._limiter.check(rate_checks(ctx, record, self._cfg))
            if verdict.degraded:
                record.extra["ratelimit_degraded"] = True
            verdict.raise_if_refused()
        except RateLimited as exc:
            record.stage = "ratelimit"
            record.limit = exc.limit
            record.decision = "deny"
            record.reason = "rate_limited"
            raise
        except LimiterUnavailable:
            record.stage = "ratelimit"
            record.decision = "error"
            record.reason = "limiter_unavailable"
            raise
