"""The gateway: what the front door (``server/``) works with, handed every collaborator at construction.

The current catalogue view (owned by ``bastion.view.ViewPublisher``), the pool and its forward under the health
monitor, the tools/call pipeline, the session stores, the access policy and the cleaner for upstream text
outside tool results. Everything it holds is either immutable and swapped whole (``View``, the access policy) or
owned by the application lifespan (pool, stores). Request handlers read ``gateway.view`` once per request, so a
refresh in the middle of a request never mixes two catalogue versions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from bastion.access import AccessControl, AllowAll, may_see_upstream
from bastion.backlog import DropHook
from bastion.call import CallContext, CallRecord, Era, Outcome
from bastion.call_ids import CallIds
from bastion.changes import ChangeFeed
from bastion.delivery import DeliveryGate
from bastion.errors import UnknownTool, UpstreamRpcError, UpstreamTimeout, UpstreamUnavailable
from bastion.pipeline import Pipeline
from bastion.principal import Principal
from bastion.ratelimit.forwarded import ForwardedLimits
from bastion.sanitize.upstream_text import UpstreamTextCleaner
from bastion.sessions.live import LiveSessions
from bastion.sessions.store import SessionStore
from bastion.settings import Settings
from bastion.strictjson import printable
from bastion.tool_entry import ToolEntry
from bastion.tracing import NO_TRACING, Tracing
from bastion.upstream.base import RelatedMessageHandler
from bastion.upstream_pool import UpstreamPool
from bastion.view import View, ViewPublisher
from bastion.visibility import ToolListings


class Gateway:
    def __init__(self, settings: Settings, *, store: SessionStore, live: LiveSessions, views: ViewPublisher,
                 pool: UpstreamPool, pipeline: Pipeline, changes: ChangeFeed[View], access: AccessControl | None = None,
                 cleaner: UpstreamTextCleaner | None = None,
                 emit_audit: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
                 tracing: Tracing = NO_TRACING, forwarded_limits: ForwardedLimits | None = None,
                 redact_text: Callable[[str], str] | None = None) -> None:
        self.settings = settings
        self.store = store
        self.live = live
        self._views = views
        self._pool = pool
        self.pool = pool
        self.pipeline = pipeline
        # Catalogue changes and resource updates for the front door, which subscribes in its constructor.
        self.changes = changes
        self.access: AccessControl = access or AllowAll()
        # Decides every message pushed outside a request's answer, at delivery (``bastion.delivery``).
        self.delivery = DeliveryGate(lambda: self.view, self.access, self.unprefixed)
        # Who sees which tools, per view and policy (tools/list reads it; bastion.visibility).
        self.listings = ToolListings()
        # Clean upstream text on its way to clients outside tool results (progress and log messages, error
        # messages, forwarded prompts/get, resources/read and completion/complete results); identities without
        # a cleaner. Arguments: upstream name, then the payload.
        self.clean_notification: Callable[[str, str, dict[str, Any]], dict[str, Any]] = \
            cleaner.clean_notification if cleaner is not None else _same_notification
        self.clean_error: Callable[[str, dict[str, Any]], dict[str, Any]] = \
            cleaner.clean_error if cleaner is not None else _same_error
        self.clean_result: Callable[[str, str, dict[str, Any]], dict[str, Any]] = \
            cleaner.clean_result if cleaner is not None else _same_notification
        self.client_request_timeout = 300.0
        # Counts a forwarded request a limit refused (its name), in the metric refused tool calls count in
        # (``bastion_ratelimit_rejections_total``): ``Metrics.ratelimit_rejected``.
        self.rate_limited: Callable[[str], None] = _not_counted
        # Counts each message a client stream's queue coalesced or dropped (``bastion.backlog``): (queue, kind).
        self.relay_dropped: DropHook = _no_drop
        # Writes one audit record that is not a tool call (tools/list…): ``AuditEvents.emit``.
        self.emit_audit: Callable[[dict[str, Any]], Awaitable[None]] = emit_audit or _discard
        # The sanitizer's secret rules, applied to what a caller typed before an audit record keeps it
        # (``SanitizeConfig.redact_text``); None: written as typed (gateways built without a sanitizer, in tests).
        self.redact_text = redact_text
        # Spans for requests, stages and forwards (bastion.tracing).
        self.tracing = tracing
        # The limits of the forwarded requests other than tools/call (``server/admission.py``); None: unlimited,
        # for gateways built without a limiter (tests of other parts).
        self.forwarded_limits = forwarded_limits
        # The id of each call (``CallContext.request_id``): 16 random hex digits.
        self.call_ids = CallIds()

    @property
    def view(self) -> View:
        """The catalogue view in force now; read it once per request."""
        return self._views.view

    async def forward(self, upstream: str, method: str, params: dict[str, Any], *,
                      on_message: RelatedMessageHandler | None) -> dict[str, Any]:
        """Send one request to an upstream under its configured timeout.

        ``on_message`` is required, and for a request made on a caller's behalf it must be that caller's relay
        (``server.relay.relay``), even when nothing can be relayed on it: it says whose request this is. Over a
        transport that cannot tell which request a server request belongs to (stdio), the upstream session gives
        one to a call only when every in-flight request it could belong to is the same principal's
        (``upstream.session.RpcSession._route``), and a request without a handler is taken for bastion's own,
        which carries nobody's data. ``None`` is for that only: what bastion sends for itself (an unsubscribe
        nobody wants any more)."""
        member = self._pool.member(upstream)
        health = self._pool.monitor
        health.check(upstream)
        # An answer counts for health only if this request was sent after the latest failure: a dying upstream
        # finishes calls it had accepted while refusing new ones; a failure only if it was sent after the latest
        # reconnection, or it failed on the connection that was replaced (``health.machine``).
        sent_at = health.now()
        try:
            with self.tracing.forward(upstream, method, params) as params:
                result = await member.upstream.request(method, params, timeout=member.timeout_s,
                                                       on_message=on_message)
        except (UpstreamUnavailable, UpstreamTimeout) as exc:
            # Passive health signal. A timeout may be one slow tool: it only starts a probe that tells slow from
            # dead; an unreachable upstream counts towards "down".
            health.failed(upstream, exc.log_detail or exc.message, soft=isinstance(exc, UpstreamTimeout),
                          sent_at=sent_at)
            raise
        except UpstreamRpcError as exc:
            health.succeeded(upstream, sent_at)
            # An upstream's error message reaches the client (and the model): it is upstream text like any other.
            err = self.clean_error(upstream, exc.to_error())
            data = err.get("data")
            raise UpstreamRpcError(exc.code, str(err.get("message", "")),
                                   data=data if isinstance(data, dict) else None,
                                   log_detail=exc.log_detail) from None
        health.succeeded(upstream, sent_at)
        return result

    async def audit_unknown_tool(self, principal: Principal, name: str, arguments: dict[str, Any], *,
                                 era: Era, session_id: str | None, client_info: Mapping[str, Any] | None,
                                 request_id: str | int | None = None, traceparent: str | None = None) -> None:
        """An unknown tool is a call too: it gets its audit record like every other."""
        await self.audit_refused_call(principal, name, arguments, era=era, session_id=session_id,
                                      client_info=client_info, request_id=request_id, stage="resolve",
                                      outcome="denied", reason="unknown tool", error=UnknownTool(name[:200]),
                                      traceparent=traceparent)

    async def audit_refused_call(self, principal: Principal, tool: ToolEntry | str, arguments: Any, *, era: Era,
                                 session_id: str | None, client_info: Mapping[str, Any] | None,
                                 request_id: str | int | None, stage: str, outcome: Outcome, reason: str,
                                 error: BaseException | None = None, audit_error: str | None = None,
                                 traceparent: str | None = None) -> None:
        """The record of a tools/call refused before its pipeline ran (unknown tool, malformed params, a
        request the parser refused): exactly one per call, like every other. ``tool`` is the entry when the name
        resolved, else the name as sent."""
        # The name as sent, made encodable: it becomes a metrics label too, and a lone surrogate there would break
        # the /metrics page, not just this record.
        # The secret rules first: the caller typed it, and it is written down twice.
        entry = tool if isinstance(tool, ToolEntry) else ToolEntry(
            public_name=self._redacted(printable(tool[:200])), upstream="", original_name="", definition={},
            upstream_definition={})
        ctx = CallContext(request_id=self.call_ids.next(), principal=principal, tool=entry,
                          arguments=arguments if isinstance(arguments, dict) else {}, era=era,
                          session_id=session_id, client_info=dict(client_info) if client_info else None,
                          client_id=request_id, traceparent=traceparent)
        record = CallRecord(stage=stage, decision="deny", reason=reason, audit_error=audit_error)
        if arguments is not None and not isinstance(arguments, dict):
            record.audit_error = f"arguments were a JSON {type(arguments).__name__}, not an object: digest of {{}}"
        await self.pipeline.audit(ctx, record, outcome, None, 0.0, error=error)

    def _redacted(self, text: str) -> str:
        """``text`` through the secret rules (``redact_text``); masked whole when they fail."""
        if self.redact_text is None:
            return text
        try:
            return self.redact_text(text)
        except Exception:
            return "[REDACTED]"

    @property
    def unprefixed(self) -> Sequence[str]:
        return [u.name for u in self.settings.upstreams if not u.prefix]

    def upstream_of(self, name: str) -> Any:
        for up in self.settings.upstreams:
            if up.name == name:
                return up
        raise KeyError(name)

    def may_see_upstream(self, principal: Principal, upstream: str) -> bool:
        """Whether anything of ``upstream`` is visible to ``principal`` (a tool, prompt or resource)."""
        return may_see_upstream(self.view, self.access, principal, upstream)

    def visible_tools(self, principal: Principal) -> list[ToolEntry]:
        return list(self.listings.listing(self.view, self.access, principal).tools)



def _not_counted(limit: str) -> None:
    return None


def _no_drop(queue: str, kind: str) -> None:
    return None


async def _discard(record: dict[str, Any]) -> None:
    return None


def _same_notification(upstream: str, method: str, payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def _same_error(upstream: str, error: dict[str, Any]) -> dict[str, Any]:
    return error
