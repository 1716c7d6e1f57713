"""Limits for the requests other than ``tools/call`` that bastion forwards to an upstream for a caller.

``prompts/get``, ``resources/read``, ``resources/subscribe``, ``resources/unsubscribe`` and ``completion/complete``
make an upstream work as a tool call does, so they pass the same limiter under the same limits (a limit item's
``methods`` narrows it to some of them). ``tools/call`` has its own step in the call pipeline
(``ratelimit.guard``), which this module mirrors: caps first, then rates, all-or-nothing, the same errors.

What ``per: principal_tool`` means for a request that names no tool is its ``Target``: the prompt for a prompt (a
catalogue name, so bounded), and for a resource the upstream serving it, never the URI: a template lets a client
name unboundedly many URIs, and each would otherwise be a fresh bucket.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Literal, NamedTuple

from bastion.ratelimit.config import RateLimitConfig
from bastion.ratelimit.gcra import RateCheck
from bastion.ratelimit.guard import merge_by_name
from bastion.ratelimit.keys import bucket_key
from bastion.ratelimit.limiter import CapCheck, Limiter
from bastion.ratelimit.model import Allowance, ConcurrencyScope, ConcurrencySpec, RateLimitSpec, Scope, for_method

__all__ = ["ForwardedLimits", "Target", "request_checks"]


class Target(NamedTuple):
    """What a forwarded request is for, as a limit's scope sees it: ``kind`` and ``name`` key ``principal_tool``
    (``prompt``: the prompt's public name; ``resources``: the upstream's name), ``upstream`` keys ``upstream``."""

    kind: Literal["prompt", "resources"]
    name: str
    upstream: str

    @classmethod
    def prompt(cls, public_name: str, upstream: str) -> Target:
        return cls("prompt", public_name, upstream)

    @classmethod
    def resources(cls, upstream: str) -> Target:
        return cls("resources", upstream, upstream)


def request_checks(defaults: tuple[RateLimitSpec, ...], caps: tuple[ConcurrencySpec, ...], method: str,
                   principal: str, target: Target,
                   allowance: Allowance) -> tuple[list[RateCheck], list[CapCheck]]:
    """The rate checks and caps of one forwarded request: the config's and the policy's that count ``method``,
    a policy limit replacing a default of its name, each at cost 1 (``costs`` weigh tools only)."""
    rates = [RateCheck.from_spec(spec, _key(spec.name, spec.scope, principal, target))
             for spec in merge_by_name(for_method(defaults, method), for_method(allowance.limits, method))]
    held = [CapCheck(name=spec.name, key=_key(spec.name, spec.scope, principal, target), max=spec.max)
            for spec in merge_by_name(for_method(caps, method), for_method(allowance.concurrency, method))]
    return rates, held


def _key(name: str, scope: Scope | ConcurrencyScope, principal: str, target: Target) -> str:
    return bucket_key(name, scope, principal=principal, tool=target.name, upstream=target.upstream, kind=target.kind)


class ForwardedLimits:
    """Admits one forwarded request other than ``tools/call`` under the limits that count its method."""

    def __init__(self, limiter: Limiter, cfg: RateLimitConfig) -> None:
        self._limiter = limiter
        self._defaults = cfg.defaults
        self._caps = cfg.concurrency

    async def admit(self, method: str, principal: str, target: Target, allowance: Allowance,
                    cleanup: AsyncExitStack) -> bool:
        """Take the request's leases (held on ``cleanup`` until its work ends) and charge its rates; raise
        ``RateLimited`` or ``LimiterUnavailable`` as a tool call would. True when Redis could not count it and
        ``failure_mode`` is open (the request goes through uncounted)."""
        if not (self._defaults or self._caps or allowance.limits or allowance.concurrency):
            return False
        rates, caps = request_checks(self._defaults, self._caps, method, principal, target, allowance)
        if caps:
            await cleanup.enter_async_context(self._limiter.lease(caps))
        verdict = await self._limiter.check(rates)
        verdict.raise_if_refused()
        return verdict.degraded

