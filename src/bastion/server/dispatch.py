"""Method dispatch: what bastion answers itself, and how it routes the rest to upstreams.

The handlers here know the MCP method shapes; they know nothing of HTTP. ``Scope`` carries what a request's era
and session established (principal, negotiated version, client capabilities) and the channel back to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog

from bastion import __version__, jsonrpc
from bastion import catalogue as cat
from bastion.audit.record import tools_list_record
from bastion.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_CLIENT_CAPABILITY,
    InvalidParams,
    MethodNotFound,
    ProtocolError,
    ToolError,
    UnknownTool,
)
from bastion.gateway import Gateway
from bastion.jsonrpc import Message, RequestId
from bastion.pipeline import ApprovalRound, AskClient, CallContext, CallRecord, Era
from bastion.principal import Principal
from bastion.server.emitter import Emitter, NullEmitter
from bastion.server.eras import INPUT_CAPABILITY, is_input_required, undeclared_inputs
from bastion.server.sessions import LiveSession, SessionData
from bastion.server.state import InvalidRequestState, RoundTrip, StateConfig, StateSealer, request_digest

log = structlog.get_logger("bastion.dispatch")

LEGACY_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSIONS = ("2026-07-28",)
LATEST_LEGACY = LEGACY_VERSIONS[-1]
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPS = "io.modelcontextprotocol/clientCapabilities"
META_INFO = "io.modelcontextprotocol/clientInfo"
META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
# Server-to-client requests an upstream may make mid-call, and the client capability each one needs.
CLIENT_REQUESTS = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}
LEGACY_ONLY = frozenset({"ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"})
SERVER_INFO = {"name": "bastion", "title": "bastion MCP gateway", "version": __version__}
# Client _meta keys passed on to upstreams; a client's own envelope (version, identity) never is.
FORWARDED_META = ("progressToken", "traceparent", "tracestate")
# Rounds of input bastion fetches from a handshake-era client for one call before giving up on the upstream.
MAX_INPUT_ROUNDS = 10
# The inputRequests key of bastion's own approval question (2026-07-28); upstream keys never reach bastion's.
APPROVAL_INPUT_KEY = "bastion-approval"


@dataclass(frozen=True, slots=True)
class Scope:
    principal: Principal
    era: Era
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any] | None
    emitter: Emitter
    session: SessionData | None = None
    live: LiveSession | None = None
    log_level: str | None = None
    # The W3C trace context of the HTTP request (headers); ``params._meta`` carries it per message and wins.
    traceparent: str | None = None
    tracestate: str | None = None


def server_capabilities() -> dict[str, Any]:
    return {"tools": {"listChanged": True}, "prompts": {"listChanged": True},
            "resources": {"listChanged": True, "subscribe": True}, "completions": {}, "logging": {}}


def negotiate(requested: Any) -> str:
    """Echo the client's version when bastion speaks it, else offer the latest legacy one (the client decides)."""
    return requested if requested in LEGACY_VERSIONS else LATEST_LEGACY


Handler = Callable[[Scope, dict[str, Any], RequestId | None], Awaitable[dict[str, Any]]]
RelayHandler = Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any] | None]]
# Request fields rebuilt for the upstream rather than copied: its envelope and the per-round MRTR fields.
ROUND_FIELDS = frozenset({"_meta", "inputResponses", "requestState"})


class Dispatcher:
    def __init__(self, gateway: Gateway, sealer: StateSealer | None = None) -> None:
        self.gw = gateway
        # requestState protection; without a configured key, a random per-process one (single replica only).
        self.sealer = sealer or StateSealer(StateConfig.from_mapping(None))
        self._handlers: dict[str, Handler] = {
            "ping": self._ping,
            "tools/list": self._tools_list,
            "tools/call": self._tools_call,
            "prompts/list": self._prompts_list,
            "prompts/get": self._prompts_get,
            "resources/list": self._resources_list,
            "resources/templates/list": self._templates_list,
            "resources/read": self._resources_read,
            "completion/complete": self._complete,
            "resources/subscribe": self._subscribe,
            "resources/unsubscribe": self._unsubscribe,
            "logging/setLevel": self._set_level,
            "server/discover": self._discover,
        }

    def knows(self, method: str, era: Era) -> bool:
        if era == "modern":
            return method in self._handlers and method not in LEGACY_ONLY
        return method in self._handlers and method != "server/discover"

    async def handle(self, scope: Scope, msg: Message) -> dict[str, Any]:
        handler = self._handlers.get(msg.method)
        if handler is None or not self.knows(msg.method, scope.era):
            raise MethodNotFound(msg.method, http_status=404 if scope.era == "modern" else 200)
        tracing = self.gw.tracing
        if not tracing.enabled:
            return await handler(scope, msg.params, msg.id)
        with tracing.request(msg.method, target=_span_target(msg.method, msg.params),
                                     meta=jsonrpc.obj(msg.params.get("_meta")), traceparent=scope.traceparent,
                                     tracestate=scope.tracestate, attributes=_span_attributes(scope, msg.id)):
            return await handler(scope, msg.params, msg.id)

    def _traceparent(self, scope: Scope, meta: Mapping[str, Any]) -> str | None:
        """The trace context an audit record joins: bastion's own span when tracing is on, else the client's."""
        own = self.gw.tracing.traceparent()
        if own is not None:
            return own
        sent = meta.get("traceparent")
        return sent if isinstance(sent, str) else scope.traceparent

    # -- local answers --------------------------------------------------------------------------------------

    async def _ping(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        return {}

    async def _set_level(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        level = params.get("level")
        if level not in LOG_LEVELS:
            raise InvalidParams(f"Invalid log level: must be one of {', '.join(LOG_LEVELS)}")
        if scope.session is not None:
            await self.gw.store.update(replace(scope.session, log_level=str(level)))
        if scope.live is not None:
            scope.live.log_level = str(level)  # this replica's GET stream relays unrelated upstream logs by it
        return {}

    def initialize_result(self, version: str) -> dict[str, Any]:
        result: dict[str, Any] = {"protocolVersion": version, "capabilities": server_capabilities(),
                                  "serverInfo": SERVER_INFO}
        if self.gw.view.instructions:
            result["instructions"] = self.gw.view.instructions
        return result

    async def _discover(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        result: dict[str, Any] = {
            "supportedVersions": [*MODERN_VERSIONS, *reversed(LEGACY_VERSIONS)],
            "capabilities": server_capabilities(),
        }
        if self.gw.view.instructions:
            result["instructions"] = self.gw.view.instructions
        return self._cache_hints(scope, result, public_ttl_ms=60_000)

    # -- tools ----------------------------------------------------------------------------------------------

    def _cache_hints(self, scope: Scope, result: dict[str, Any], public_ttl_ms: int = 30_000) -> dict[str, Any]:
        if scope.era == "modern":
            # What a caller sees depends on who it is as soon as a policy filters lists: never a shared cache.
            # server/discover included: it answers after authentication, from the same gateway that filters the
            # lists, and a shared cache keyed on the URL alone would serve it across principals.
            result["ttlMs"] = 0 if self.gw.access.per_principal else public_ttl_ms
            result["cacheScope"] = "private" if self.gw.access.per_principal else "public"
        return result

    async def _tools_list(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        listing = self.gw.listings.listing(self.gw.view, self.gw.access, scope.principal)
        if params.get("cursor") is None:
            # One record per listing (its first page), saying how much the policy hid from this caller.
            await self.gw.emit_audit(tools_list_record(
                at=time.time(), shown=len(listing.tools), hidden=listing.hidden,
                request_id=rid,
                session=scope.session.id if scope.session else None, era=scope.era, principal=scope.principal,
                client_info=scope.client_info, traceparent=self._traceparent(scope, jsonrpc.obj(params.get("_meta"))),
                upstreams_failed=[n for n, up in (self.gw.pool.health() if self.gw.pool else {}).items() if not up]))
        # The page comes pre-encoded (an orjson.Fragment): the response encoder embeds it as is.
        tools, next_cursor = listing.page(params.get("cursor"), self.gw.settings.catalogue.page_size)
        result: dict[str, Any] = {"tools": tools}
        if next_cursor is not None:
            result["nextCursor"] = next_cursor
        return self._cache_hints(scope, result)

    async def _tools_call(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        name = params.get("name")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        session_id = scope.session.id if scope.session else None
        problem = "tools/call requires a string 'name'" if not isinstance(name, str) else \
            "tools/call 'arguments' must be an object" if not isinstance(arguments, dict) else None
        if problem is not None:
            refusal = InvalidParams(problem)
            await self.gw.audit_refused_call(scope.principal, name if isinstance(name, str) else "", arguments,
                                             era=scope.era, session_id=session_id, client_info=scope.client_info,
                                             request_id=rid, stage="parse", outcome="invalid_input",
                                             reason=problem, error=refusal,
                                             traceparent=self._traceparent(scope, jsonrpc.obj(params.get("_meta"))))
            raise refusal
        assert isinstance(name, str)
        assert isinstance(arguments, dict)
        view = self.gw.view
        entry = view.catalogue.tool(name)
        meta = jsonrpc.obj(params.get("_meta"))
        if entry is None:
            await self.gw.audit_unknown_tool(scope.principal, name, arguments, era=scope.era,
                                             session_id=session_id, client_info=scope.client_info,
                                             request_id=rid, traceparent=self._traceparent(scope, meta))
            raise UnknownTool(name)
        ctx = CallContext(
            request_id=secrets.token_hex(8), principal=scope.principal, tool=entry, arguments=arguments,
            era=scope.era, session_id=session_id,
            client_info=dict(scope.client_info) if scope.client_info else None,
            traceparent=self._traceparent(scope, meta),
            client_id=rid, ask_client=self._asker(scope),
        )
        progress_token = meta.get("progressToken")
        try:
            trip = self._open_round(scope, "tools/call", name, params, entry.upstream)
        except ProtocolError as exc:
            # A retry whose requestState bastion cannot verify is refused before the pipeline: still a call.
            await self.gw.audit_refused_call(scope.principal, entry, arguments, era=scope.era,
                                             session_id=session_id, client_info=scope.client_info,
                                             request_id=rid, stage="resolve", outcome="denied",
                                             reason=exc.message, error=exc, traceparent=ctx.traceparent)
            raise
        if scope.era == "modern":
            ctx = replace(ctx, approval_round=approval_round(scope, params, trip))
        marker: list[str] = []

        async def forward(ctx: CallContext, record: CallRecord) -> dict[str, Any]:
            if record.approval_question is not None:
                # bastion's own question (an approve rule), asked instead of forwarding: the upstream sees the
                # call only once the retry carries the user's yes.
                marker.append(f"ask:{record.rule_id}")
                return {"resultType": "input_required", "inputRequests": {
                    APPROVAL_INPUT_KEY: {"method": "elicitation/create", "params": record.approval_question}}}
            if record.approval is not None and record.approval.get("outcome") == "approved":
                marker.append(f"ok:{record.rule_id}")  # later rounds of this request need not ask again
            fwd: dict[str, Any] = {"name": entry.original_name, "arguments": ctx.arguments}
            relay = self._relay(scope, entry.upstream, progress_token)
            return await self._forward_rounds(scope, entry.upstream, "tools/call", fwd, meta, params, trip, relay)

        result = await self.gw.pipeline.run(ctx, forward)
        if is_input_required(result):
            return self._input_required(scope, "tools/call", name, params, entry.upstream, result,
                                        approval=marker[-1] if marker else None)
        # After the guards: they judge (and the sanitizer vets) the URIs exactly as the upstream sent them.
        return map_result_uris(result, self.gw.upstream_of(entry.upstream).prefix)

    def _asker(self, scope: Scope) -> AskClient | None:
        """How a guard asks this caller something mid-call: a session-based client that declared elicitation,
        on a request whose response stream can carry the question; otherwise None."""
        if scope.era != "legacy" or "elicitation" not in scope.client_capabilities or \
                isinstance(scope.emitter, NullEmitter):
            return None
        emitter = scope.emitter

        async def ask(method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
            return await emitter.ask(method, params, timeout=timeout)

        return ask

    # -- multi round-trip requests (2026-07-28 input_required) ----------------------------------------------

    def _upstream_is_modern(self, upstream: str) -> bool:
        if self.gw.pool is None:
            return False
        info = self.gw.pool.member(upstream).upstream.info
        return info is not None and info.era == "modern"

    def _forward_meta(self, scope: Scope, upstream: str, meta: Mapping[str, Any]) -> dict[str, Any]:
        """The ``_meta`` bastion sends upstream: trace context and progress token, plus, for a modern upstream,
        the input capabilities bastion can relay for this caller (so the upstream asks only for what it can get).
        """
        out = {k: meta[k] for k in FORWARDED_META if k in meta}
        if "traceparent" not in out and scope.traceparent is not None:
            # A client that traces at the HTTP layer only: its context still reaches the upstream (when bastion
            # traces, ``Tracing.forward`` replaces it with bastion's own client span).
            out["traceparent"] = scope.traceparent
            if scope.tracestate is not None:
                out["tracestate"] = scope.tracestate
        if self._upstream_is_modern(upstream):
            relayable = scope.era == "modern" or not isinstance(scope.emitter, NullEmitter)
            out[META_CAPS] = {k: v for k, v in scope.client_capabilities.items()
                              if k in INPUT_CAPABILITY.values()} if relayable else {}
            # A modern upstream logs only when the request asks; a handshake-era client without a floor gets
            # everything (its era's default), so bastion asks for everything on its behalf.
            level = scope.log_level or ("debug" if scope.era == "legacy" else None)
            if level is not None:
                out[META_LOG_LEVEL] = level
        return out

    def _open_round(self, scope: Scope, method: str, target: str, params: Mapping[str, Any],
                    upstream: str) -> RoundTrip | None:
        """Verify the ``requestState`` of a retried request; ``None`` for a first request."""
        state = params.get("requestState")
        if state is None:
            # Nothing of bastion's to verify: a first request. Stray inputResponses go to the upstream unchanged
            # (the client could send them there directly); it ignores them or asks again.
            return None
        try:
            trip = self.sealer.open(state, principal_id=scope.principal.id,
                                    digest=request_digest(method, target, params), now=time.time())
            if trip.upstream != upstream:
                raise InvalidRequestState("issued for a request another upstream served")
        except InvalidRequestState as exc:
            log.info("request_state.refused", method=method, target=target[:200], principal=scope.principal.id,
                     reason=exc.log_detail)
            raise
        return trip

    async def _forward_rounds(self, scope: Scope, upstream: str, method: str, fwd: dict[str, Any],
                              meta: Mapping[str, Any], params: Mapping[str, Any], trip: RoundTrip | None,
                              relay: RelayHandler | None = None) -> dict[str, Any]:
        """Forward one request; for a handshake-era client, also fetch the input a modern upstream asks for.

        A modern client gets an upstream's ``input_required`` back (``_input_required`` wraps its state) and
        retries on its own. A handshake-era client cannot: bastion asks it on the call's SSE stream, as the
        server-to-client requests it knows, and retries the upstream with the answers, within this one call.
        """
        out_meta = self._forward_meta(scope, upstream, meta)
        if out_meta:
            fwd["_meta"] = out_meta
        responses = params.get("inputResponses")
        if isinstance(responses, Mapping) and APPROVAL_INPUT_KEY in responses:
            # The answer to bastion's approval question is bastion's; the upstream never asked for it.
            responses = {k: v for k, v in responses.items() if k != APPROVAL_INPUT_KEY} or None
        if responses is not None:
            fwd["inputResponses"] = responses
        if trip is not None and trip.upstream_state is not None:
            fwd["requestState"] = trip.upstream_state
        result = await self.gw.forward(upstream, method, fwd, on_message=relay)
        rounds = 0
        while scope.era == "legacy" and is_input_required(result):
            rounds += 1
            if rounds > MAX_INPUT_ROUNDS:
                raise ToolError(f"The upstream asked for input more than {MAX_INPUT_ROUNDS} times; call abandoned")
            responses = await self._ask_legacy_client(scope, upstream, result.get("inputRequests"))
            if not responses:
                await asyncio.sleep(0.05 * rounds)  # state-only round: the upstream is still working
            fwd = {k: v for k, v in fwd.items() if k not in ("inputResponses", "requestState")}
            if responses:
                fwd["inputResponses"] = responses
            if isinstance(result.get("requestState"), str):
                fwd["requestState"] = result["requestState"]
            result = await self.gw.forward(upstream, method, fwd, on_message=relay)
        return result

    async def _ask_legacy_client(self, scope: Scope, upstream: str, requests: Any) -> dict[str, Any]:
        if not isinstance(requests, Mapping):
            return {}
        responses: dict[str, Any] = {}
        for key, request in requests.items():
            kind = request.get("method") if isinstance(request, Mapping) else None
            capability = INPUT_CAPABILITY.get(kind) if isinstance(kind, str) else None
            if capability is None or capability not in scope.client_capabilities or \
                    isinstance(scope.emitter, NullEmitter):
                raise ToolError(f"The tool needs input from the client ({kind}) that this client cannot provide "
                                "on this request")
            assert isinstance(request, Mapping)
            try:
                responses[str(key)] = await scope.emitter.ask(
                    str(kind), self.gw.clean_notification(upstream, str(kind), jsonrpc.obj(request.get("params"))),
                    timeout=self.gw.client_request_timeout)
            except ProtocolError as exc:
                raise ToolError(f"The client did not provide the input the tool needs: {exc.message}") from None
        return responses

    def _input_required(self, scope: Scope, method: str, target: str, params: Mapping[str, Any], upstream: str,
                        result: Mapping[str, Any], approval: str | None = None) -> dict[str, Any]:
        """An upstream's ``input_required`` for a modern client, its state sealed (see ``bastion.server.state``).

        Handshake-era clients never get here (``_forward_rounds`` bridges tools/call for them).
        """
        if scope.era != "modern":
            raise ProtocolError(INTERNAL_ERROR, f"The upstream needs input from the client to answer {method}; "
                                "bastion relays such input to handshake-era clients only for tools/call")
        missing = undeclared_inputs(result.get("inputRequests"), scope.client_capabilities)
        if missing:
            kinds = sorted({INPUT_CAPABILITY.get(str(jsonrpc.obj(result["inputRequests"][k]).get("method")), "?")
                            for k in missing} - {"?"})
            raise ProtocolError(MISSING_CLIENT_CAPABILITY,
                                "The upstream needs input of a kind this client did not declare",
                                data={"requiredCapabilities": {k: {} for k in kinds}}, http_status=400)
        state = result.get("requestState")
        out: dict[str, Any] = {"resultType": "input_required"}
        if isinstance(result.get("inputRequests"), Mapping):
            # The questions reach a person or a model: upstream text, cleaned like any other.
            out["inputRequests"] = {
                key: {**request, "params": self.gw.clean_notification(upstream, str(request.get("method")),
                                                                      jsonrpc.obj(request.get("params")))}
                if isinstance(request, Mapping) else request
                for key, request in result["inputRequests"].items()}
        out["requestState"] = self.sealer.seal(
            principal_id=scope.principal.id, digest=request_digest(method, target, params), upstream=upstream,
            upstream_state=state if isinstance(state, str) else None, now=time.time(), approval=approval)
        return out

    def _relay(self, scope: Scope, upstream: str, progress_token: Any) -> Callable[
            [str, Mapping[str, Any]], Awaitable[Mapping[str, Any] | None]]:
        return _OwnedRelay(scope.principal.id, self._relay_to(scope, upstream, progress_token))

    def _relay_to(self, scope: Scope, upstream: str, progress_token: Any) -> Callable[
            [str, Mapping[str, Any]], Awaitable[Mapping[str, Any] | None]]:
        async def on_message(method: str, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
            if method == "notifications/progress":
                if progress_token is not None:
                    await scope.emitter.notify(method, self.gw.clean_notification(upstream, method, dict(params)))
                return None
            if method == "notifications/message":
                if _level_allows(scope.log_level, params.get("level"), scope.era):
                    await scope.emitter.notify(method, self.gw.clean_notification(upstream, method, dict(params)))
                return None
            capability = CLIENT_REQUESTS.get(method)
            if method == "roots/list" and (scope.era != "legacy" or capability not in scope.client_capabilities
                                           or isinstance(scope.emitter, NullEmitter)):
                # bastion advertises roots to upstreams; a caller that cannot be asked shares none.
                return {"roots": []}
            if capability is not None:
                if scope.era != "legacy":
                    # A 2026-07-28 client can only be asked through an input_required result, which would need
                    # this upstream call held open across HTTP requests: refused, so the upstream can degrade.
                    raise ProtocolError(-32601, f"{method} cannot be relayed to a 2026-07-28 client mid-call")
                if capability not in scope.client_capabilities:
                    raise ProtocolError(-32601, f"the client did not declare the {capability} capability")
                return await scope.emitter.ask(method, self.gw.clean_notification(upstream, method, dict(params)),
                                               timeout=self.gw.client_request_timeout)
            if method.startswith("notifications/"):
                return None
            raise ProtocolError(-32601, f"Method not found: {method}")

        return on_message

    # -- prompts --------------------------------------------------------------------------------------------

    async def _prompts_list(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        visible = [p for p in self.gw.view.catalogue.prompts
                   if self.gw.access.prompt_visible(scope.principal, p.upstream, p.public_name)]
        start, end, nxt = cat.page([p.public_name for p in visible], params.get("cursor"),
                                   self.gw.settings.catalogue.page_size)
        result: dict[str, Any] = {"prompts": [dict(p.definition) for p in visible[start:end]]}
        if nxt is not None:
            result["nextCursor"] = nxt
        return self._cache_hints(scope, result)

    async def _prompts_get(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        name = params.get("name")
        entry = self.gw.view.catalogue.prompt(name) if isinstance(name, str) else None
        if entry is None or not self.gw.access.prompt_visible(scope.principal, entry.upstream, entry.public_name):
            raise InvalidParams(f"Unknown prompt: {name}")
        trip = self._open_round(scope, "prompts/get", entry.public_name, params, entry.upstream)
        fwd = {k: v for k, v in params.items() if k not in ROUND_FIELDS}
        fwd["name"] = entry.original_name
        result = await self._forward_rounds(scope, entry.upstream, "prompts/get", fwd,
                                            jsonrpc.obj(params.get("_meta")), params, trip)
        if is_input_required(result):
            return self._input_required(scope, "prompts/get", entry.public_name, params, entry.upstream, result)
        return self.gw.clean_result(entry.upstream, "prompts/get", result)

    # -- resources ------------------------------------------------------------------------------------------

    async def _resources_list(self, scope: Scope, params: dict[str, Any],
                              rid: RequestId | None) -> dict[str, Any]:
        return self._list_resources(scope, params, self.gw.view.catalogue.resources, "uri", "resources")

    async def _templates_list(self, scope: Scope, params: dict[str, Any],
                              rid: RequestId | None) -> dict[str, Any]:
        return self._list_resources(scope, params, self.gw.view.catalogue.templates, "uriTemplate",
                                    "resourceTemplates")

    def _list_resources(self, scope: Scope, params: dict[str, Any],
                        items: tuple[tuple[str, Mapping[str, Any]], ...], key: str, out: str) -> dict[str, Any]:
        visible = sorted(((up, r) for up, r in items
                          if self.gw.access.resource_visible(scope.principal, up, str(r.get(key)))),
                         key=lambda pair: str(pair[1].get(key)))
        start, end, nxt = cat.page([str(r.get(key)) for _, r in visible], params.get("cursor"),
                                   self.gw.settings.catalogue.page_size)
        result: dict[str, Any] = {out: [dict(r) for _, r in visible[start:end]]}
        if nxt is not None:
            result["nextCursor"] = nxt
        return self._cache_hints(scope, result)

    async def _resources_read(self, scope: Scope, params: dict[str, Any],
                              rid: RequestId | None) -> dict[str, Any]:
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise InvalidParams("resources/read requires a string 'uri'")
        upstream, original = self._route_visible(scope, uri)
        trip = self._open_round(scope, "resources/read", uri, params, upstream)
        fwd = {k: v for k, v in params.items() if k not in ROUND_FIELDS}
        fwd["uri"] = original
        result = await self._forward_rounds(scope, upstream, "resources/read", fwd, jsonrpc.obj(params.get("_meta")),
                                            params, trip)
        if is_input_required(result):
            return self._input_required(scope, "resources/read", uri, params, upstream, result)
        result = self.gw.clean_result(upstream, "resources/read", result)
        prefix = self.gw.upstream_of(upstream).prefix
        contents = result.get("contents")
        if prefix and isinstance(contents, list):
            result["contents"] = [
                {**c, "uri": cat.public_uri(prefix, c["uri"])} if isinstance(c, dict) and isinstance(
                    c.get("uri"), str) else c for c in contents]
        return self._cache_hints(scope, result)

    def _route_visible(self, scope: Scope, uri: Any) -> tuple[str, str]:
        routed = cat.route_uri(self.gw.view.catalogue, uri, self.gw.unprefixed) if isinstance(uri, str) else None
        if routed is None or not self.gw.access.resource_visible(scope.principal, routed[0], str(uri)):
            raise InvalidParams(f"Resource not found: {uri}", data={"uri": uri})
        return routed

    async def _subscribe(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        uri = params.get("uri")
        upstream, original = self._route_visible(scope, uri)
        await self.gw.forward(upstream, "resources/subscribe", {"uri": original})
        if scope.live is not None:
            scope.live.subscriptions.add(str(uri))
        return {}

    async def _unsubscribe(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        uri = params.get("uri")
        upstream, original = self._route_visible(scope, uri)
        if scope.live is not None:
            scope.live.subscriptions.discard(str(uri))
        # Other sessions of this replica may still want updates for the same resource.
        if not any(str(uri) in live.subscriptions for live in self.gw.live.all()):
            await self.gw.forward(upstream, "resources/unsubscribe", {"uri": original})
        return {}

    async def listen_resources(self, scope: Scope, uris: Iterable[str]) -> frozenset[str]:
        """Subscribe upstream to the resources a listen request names; the ones that worked are honoured.

        Only handshake-era upstreams can be subscribed to (``resources/subscribe``): bastion's own listen
        stream to a modern upstream carries list changes only, so their resources are not honoured.
        """
        honoured: set[str] = set()
        for uri in sorted(uris):
            try:
                upstream, original = self._route_visible(scope, uri)
                if self._upstream_is_modern(upstream):
                    continue
                await self.gw.forward(upstream, "resources/subscribe", {"uri": original})
            except ProtocolError:
                continue
            honoured.add(uri)
        return frozenset(honoured)

    async def release_resources(self, uris: Iterable[str], still_wanted: set[str]) -> None:
        """Unsubscribe upstream from resources nobody on this replica listens to any more (best effort)."""
        for uri in uris:
            if uri in still_wanted or any(uri in live.subscriptions for live in self.gw.live.all()):
                continue
            routed = cat.route_uri(self.gw.view.catalogue, uri, self.gw.unprefixed)
            if routed is None:
                continue
            with contextlib.suppress(ProtocolError):
                await self.gw.forward(routed[0], "resources/unsubscribe", {"uri": routed[1]})

    # -- completion -----------------------------------------------------------------------------------------

    async def _complete(self, scope: Scope, params: dict[str, Any], rid: RequestId | None) -> dict[str, Any]:
        ref = params.get("ref")
        if not isinstance(ref, dict):
            raise InvalidParams("completion/complete requires a 'ref' object")
        if ref.get("type") == "ref/prompt":
            name = ref.get("name")
            entry = self.gw.view.catalogue.prompt(name) if isinstance(name, str) else None
            if entry is None or not self.gw.access.prompt_visible(scope.principal, entry.upstream,
                                                                  entry.public_name):
                raise InvalidParams(f"Unknown prompt: {name}")
            return self.gw.clean_result(entry.upstream, "completion/complete", await self.gw.forward(
                entry.upstream, "completion/complete", {**params, "ref": {**ref, "name": entry.original_name}}))
        if ref.get("type") == "ref/resource":
            uri = ref.get("uri")
            routed = cat.route_uri(self.gw.view.catalogue, uri, self.gw.unprefixed) if isinstance(uri, str) \
                else None
            if routed is None or not self.gw.access.resource_visible(scope.principal, routed[0], str(uri)):
                raise InvalidParams(f"Unknown resource template: {uri}")
            return self.gw.clean_result(routed[0], "completion/complete", await self.gw.forward(
                routed[0], "completion/complete", {**params, "ref": {**ref, "uri": routed[1]}}))
        raise ProtocolError(INVALID_PARAMS, "ref.type must be ref/prompt or ref/resource")


def _span_target(method: str, params: Mapping[str, Any]) -> str | None:
    name = params.get("name") if method in ("tools/call", "prompts/get") else None
    return name[:200] if isinstance(name, str) else None


def _span_attributes(scope: Scope, rid: RequestId | None) -> dict[str, str | int]:
    attrs: dict[str, str | int] = {"mcp.protocol.version": scope.protocol_version,
                                   "bastion.principal.id": scope.principal.id, "bastion.era": scope.era}
    if rid is not None:
        attrs["jsonrpc.request.id"] = str(rid)
    if scope.session is not None:
        attrs["mcp.session.id"] = scope.session.id
    return attrs


def approval_round(scope: Scope, params: Mapping[str, Any], trip: RoundTrip | None) -> ApprovalRound:
    """What this 2026-07-28 request says about bastion's approval question. Only a verified ``requestState``
    (bound to this principal and this exact request) can carry an answer or an earlier approval."""
    marker = trip.approval if trip is not None else None
    responses = params.get("inputResponses")
    answer = responses.get(APPROVAL_INPUT_KEY) if isinstance(responses, Mapping) else None
    asked = marker[4:] if marker is not None and marker.startswith("ask:") else None
    return ApprovalRound(can_ask="elicitation" in scope.client_capabilities, asked_rule=asked,
                        answer=dict(answer) if asked is not None and isinstance(answer, Mapping) else None,
                        approved_rule=marker[3:] if marker is not None and marker.startswith("ok:") else None)


def _level_allows(floor: str | None, level: Any, era: Era) -> bool:
    if floor is None:
        # Modern clients get log messages only when they asked (per request); legacy ones until they set a floor.
        return era == "legacy"
    try:
        return LOG_LEVELS.index(str(level)) >= LOG_LEVELS.index(floor)
    except ValueError:
        return False


def _routable(uri: Any) -> bool:
    # Web URLs are links for people, not resources of this upstream: they stay as they are.
    return isinstance(uri, str) and not uri.lower().startswith(("http://", "https://"))


def map_result_uris(result: dict[str, Any], prefix: str | None) -> dict[str, Any]:
    """Give resource URIs inside a prefixed upstream's tool result their public form, so reads route back."""
    content = result.get("content")
    if not prefix or not isinstance(content, list):
        return result
    mapped = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "resource_link" and _routable(block.get("uri")):
            block = {**block, "uri": cat.public_uri(prefix, block["uri"])}
        elif isinstance(block, dict) and block.get("type") == "resource" and isinstance(block.get("resource"), dict) \
                and _routable(block["resource"].get("uri")):
            block = {**block, "resource": {**block["resource"],
                                           "uri": cat.public_uri(prefix, block["resource"]["uri"])}}
        mapped.append(block)
    return {**result, "content": mapped}


class _OwnedRelay:
    """A call's message relay that says whose call it is: on a transport without per-request streams (stdio), the
    upstream session may route an unattributed server request by it (``upstream.session.owner_of``)."""

    __slots__ = ("_relay", "owner")

    def __init__(self, owner: str, relay: Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any] | None]]):
        self.owner = owner
        self._relay = relay

    async def __call__(self, method: str, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return await self._relay(method, params)
