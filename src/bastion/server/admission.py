"""The limiter's door for the forwarded requests other than ``tools/call``: one per request, before the upstream.

``prompts/get``, ``resources/read``, ``resources/subscribe``/``unsubscribe`` (and each resource a 2026-07-28 listen
request subscribes to) and ``completion/complete`` enter the upstream only inside ``Admission.held``: the request's
concurrency leases are held for as long as its body runs (and past it, for an upstream request it abandoned:
``bastion.holdover``), its rates are charged once however many rounds it takes. A refusal is the one a tool call
gets (``-31001``/``-31004``, the same limiter metric), and its ``request.refused`` audit record is written before
the client is answered, as a refused call's ``tool.call`` is.

``tools/call`` keeps its own step in the call pipeline (``ratelimit.guard``), which this mirrors.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from bastion.audit.record import request_refused_record
from bastion.errors import LimiterUnavailable, RateLimited
from bastion.gateway import Gateway
from bastion.jsonrpc import RequestId
from bastion.ratelimit.forwarded import ForwardedLimits, Target
from bastion.ratelimit.model import Allowance
from bastion.server.scope import Scope

__all__ = ["Admission"]


class Admission:
    def __init__(self, gateway: Gateway, limits: ForwardedLimits | None) -> None:
        self.gw = gateway
        # None: a gateway built without a limiter (tests of other parts); assembly always gives one.
        self._limits = limits

    @asynccontextmanager
    async def held(self, scope: Scope, method: str, target: Target, allowance: Allowance, *,
                   rid: RequestId | None, uri: str | None = None,
                   traceparent: str | None = None) -> AsyncIterator[None]:
        """Admit one request of ``scope``'s caller to ``target`` (``uri``: the public URI, for the record), or
        raise the limiter's refusal after auditing it."""
        if self._limits is None:
            yield
            return
        async with AsyncExitStack() as cleanup:
            try:
                await self._limits.admit(method, scope.principal.id, target, allowance, cleanup)
            except (RateLimited, LimiterUnavailable) as exc:
                if isinstance(exc, RateLimited):
                    self.gw.rate_limited(exc.limit)
                await self.gw.emit_audit(request_refused_record(
                    at=time.time(), method=method, name=target.name if target.kind == "prompt" else None, uri=uri,
                    upstream=target.upstream, error=exc, request_id=rid,
                    session=scope.session.id if scope.session is not None else None, era=scope.era,
                    principal=scope.principal, client_info=scope.client_info,
                    traceparent=traceparent if traceparent is not None else scope.traceparent))
                raise
            yield

