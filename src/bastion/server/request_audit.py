"""One ``request`` audit record for each forwarded request other than ``tools/call``, whatever its end.

``prompts/get``, ``resources/read``, ``resources/subscribe``/``unsubscribe``, ``completion/complete`` (and each
resource a 2026-07-28 listen request subscribes to) run their body inside ``RequestAudit.run``: the body fills a
``RequestFacts`` as it gets further (what it was for, how far it got, how long the upstream took), and the record
is written when the body ends, before the client is answered, as a tool call's is: a result, an error (unknown or
hidden target, the limiter's refusal, the upstream's failure), or the client going away. Under
``audit.required`` a record that cannot be written turns the answer into ``-31005``, as for a tool call.

``tools/call`` keeps its pipeline and its own ``tool.call`` record; nothing here runs for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from bastion.audit.record import RequestTarget, request_record
from bastion.errors import AuditUnavailable
from bastion.gateway import Gateway
from bastion.jsonrpc import RequestId
from bastion.principal import Principal
from bastion.protocol.meta import PROTOCOL_VERSION_KEY
from bastion.protocol.methods import FORWARDED, TOOLS_CALL
from bastion.server.scope import Scope

__all__ = ["AUDITED", "RequestAudit", "RequestFacts", "refused_record"]

# The requests that get a ``request`` record: every forwarded one but tools/call, which has its own.
AUDITED = frozenset(FORWARDED) - {TOOLS_CALL}

log = structlog.get_logger("bastion.audit")

T = TypeVar("T")


@dataclass(slots=True)
class RequestFacts:
    """What one request's body established, for its record. ``stage`` moves on as the body does
    (``audit.record.REQUEST_STAGES``); ``recorded`` is cleared for a body that forwarded nothing and answered
    nothing of its own (a listen request's resource on an upstream that cannot be subscribed to)."""

    method: str
    target: RequestTarget = field(default_factory=RequestTarget)
    stage: str = "parse"
    reason: str | None = None
    upstream_ms: float | None = None
    recorded: bool = True
    # The limiter could not count it (its Redis failed) and let it through: ``failure_mode: open``.
    ratelimit_degraded: bool = False
    # What takes back the body's lasting effect (a subscription) when its record cannot be written: the caller is
    # answered -31005, so nothing it was told failed may go on taking effect.
    undo: Callable[[], Awaitable[None]] | None = None

    def asked(self, *, name: str | None = None, uri: str | None = None) -> None:
        """The params were read: what the caller asked for, as it named it."""
        self.target = RequestTarget(name=name, uri=uri)
        self.stage = "resolve"

    def resolved(self, upstream: str, original: str, *, name: str | None = None, uri: str | None = None) -> None:
        """The target is one this caller may see: its public name or URI, its upstream and the upstream's own."""
        self.target = RequestTarget(name=name, uri=uri, upstream=upstream, original=original)


class RequestAudit:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def run(self, scope: Scope, method: str, rid: RequestId | None, traceparent: str | None,
                  body: Callable[[RequestFacts], Awaitable[T]]) -> T:
        """Run ``body`` and write its record before its result (or error) goes on to the caller."""
        facts = RequestFacts(method)
        at = time.time()
        started = time.perf_counter()
        try:
            result = await body(facts)
        except asyncio.CancelledError as exc:
            try:
                await self._emit(scope, facts, rid, traceparent, at, started, exc, None)
            except AuditUnavailable:
                # Nobody waits for an answer any more, and the cancellation must reach whoever cancelled: the
                # sink failure is already counted and logged by the audit log.
                log.warning("audit.unavailable_on_cancel", method=method)
            raise
        except Exception as exc:
            # AuditUnavailable raised here replaces the error: the caller learns the request was not recorded.
            await self._emit(scope, facts, rid, traceparent, at, started, exc, None)
            raise
        if facts.recorded:
            facts.stage = "complete"
            try:
                await self._emit(scope, facts, rid, traceparent, at, started, None,
                                 result if isinstance(result, dict) else None)
            except AuditUnavailable:
                if facts.undo is not None:
                    try:
                        await facts.undo()
                    except Exception:
                        log.warning("audit.undo_failed", method=facts.method, exc_info=True)
                raise
        return result

    async def _emit(self, scope: Scope, facts: RequestFacts, rid: RequestId | None, traceparent: str | None,
                    at: float, started: float, error: BaseException | None, result: dict[str, Any] | None) -> None:
        total_ms = (time.perf_counter() - started) * 1000
        await self.gw.emit_audit(request_record(
            at=at, method=facts.method, target=facts.target, stage=facts.stage, total_ms=total_ms,
            upstream_ms=facts.upstream_ms, error=error, result=result, reason=facts.reason, request_id=rid,
            session=scope.session.id if scope.session is not None else None, era=scope.era,
            principal=scope.principal, client_info=scope.client_info,
            traceparent=traceparent if traceparent is not None else scope.traceparent,
            ratelimit_degraded=facts.ratelimit_degraded, redact=self.gw.redact_text))


def refused_record(principal: Principal, method: str, params: Mapping[str, Any], rid: RequestId | None,
                   error: BaseException, scope: Scope | None = None,
                   redact: Callable[[str], str] | None = None) -> dict[str, Any]:
    """The ``request`` record of a request the front door refused before the dispatcher saw it (its envelope or
    headers, its session, its body, an id already in flight): stage ``parse``, the target as the caller named it.
    Without the request's verified ``scope``, the era is read from the body and the session is not recorded."""
    ref = params.get("ref")
    named = ref if isinstance(ref, Mapping) else params
    name, uri = named.get("name"), named.get("uri")
    meta = params.get("_meta")
    return request_record(
        at=time.time(), method=method,
        target=RequestTarget(name=name if isinstance(name, str) else None, uri=uri if isinstance(uri, str) else None),
        stage="parse", total_ms=0.0, upstream_ms=None, error=error, result=None, reason=None, request_id=rid,
        session=scope.session.id if scope is not None and scope.session is not None else None,
        era=scope.era if scope is not None else
        "modern" if isinstance(meta, Mapping) and PROTOCOL_VERSION_KEY in meta else "legacy",
        principal=principal, client_info=scope.client_info if scope is not None else None,
        traceparent=scope.traceparent if scope is not None else None, redact=redact)
