"""The limiter's door for the forwarded requests other than ``tools/call``: one per request, before the upstream.

``prompts/get``, ``resources/read``, ``resources/subscribe``/``unsubscribe`` (and each resource a 2026-07-28 listen
request subscribes to) and ``completion/complete`` enter the upstream only inside ``Admission.held``: the request's
concurrency leases are held for as long as its body runs (and past it, for an upstream request it abandoned:
``bastion.holdover``), its rates are charged once however many rounds it takes. A refusal is the one a tool call
gets (``-31001``/``-31004``, the same limiter metric); the request's ``request`` audit record, refused or not, is
written around this by ``server/request_audit.py``, before the client is answered.

``tools/call`` keeps its own step in the call pipeline (``ratelimit.guard``), which this mirrors.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from bastion.errors import RateLimited
from bastion.gateway import Gateway
from bastion.ratelimit.forwarded import ForwardedLimits, Target
from bastion.ratelimit.model import Allowance
from bastion.server.request_audit import RequestFacts
from bastion.server.scope import Scope

__all__ = ["Admission"]


class Admission:
    def __init__(self, gateway: Gateway, limits: ForwardedLimits | None) -> None:
        self.gw = gateway
        # None: a gateway built without a limiter (tests of other parts); assembly always gives one.
        self._limits = limits

    @asynccontextmanager
    async def held(self, scope: Scope, method: str, target: Target, allowance: Allowance,
                   facts: RequestFacts) -> AsyncIterator[None]:
        """Admit one request of ``scope``'s caller to ``target``, or raise the limiter's refusal; ``facts`` learns how
        far the request got (its ``request`` record is written by ``RequestAudit``, around this)."""
        facts.stage = "ratelimit"
        async with AsyncExitStack() as cleanup:
            if self._limits is not None:
                try:
                    facts.ratelimit_degraded = await self._limits.admit(method, scope.principal.id, target,
                                                                        allowance, cleanup)
                except RateLimited as exc:
                    self.gw.rate_limited(exc.limit)
                    raise
            facts.stage = "forward"
            started = time.perf_counter()
            try:
                yield
            finally:
                facts.upstream_ms = (time.perf_counter() - started) * 1000
