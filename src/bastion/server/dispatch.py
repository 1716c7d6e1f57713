"""The method table: what bastion answers itself, and how it routes the rest to upstreams.

The handlers here know the MCP method shapes; they know nothing of HTTP. ``Scope`` (``server/scope.py``) carries
what a request's era and session established and the channel back to the client. Each handler reads its params
through the ``TypedDict`` of its method (``bastion.protocol.messages``) and answers a result object; errors are
raised (``bastion.errors``) and shaped into JSON-RPC by the front door.

What is not a method lives next door, each part in its own module because it has a life of its own:

- ``server/rounds.py``: forwarding, and the multi round-trip (``input_required`` / ``requestState``) bridge between
  the eras, the only state bastion keeps across HTTP requests;
- ``server/resources.py``: public resource URIs in both directions, and upstream subscriptions, which the
  2026-07-28 listen stream uses outside any method;
- ``server/relay.py``: what an upstream sends back mid-call, and whether the caller can receive it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, cast

import structlog

from bastion import __version__, jsonrpc
from bastion import catalogue as cat
from bastion.audit.record import tools_list_record
from bastion.call import CallContext, CallRecord, Era
from bastion.errors import INVALID_PARAMS, InvalidParams, MethodNotFound, ProtocolError, UnknownTool
from bastion.gateway import Gateway
from bastion.jsonrpc import Message, RequestId
from bastion.protocol import methods as m
from bastion.protocol.messages import (
    CallToolParams,
    CompleteParams,
    CompletionRef,
    GetPromptParams,
    PaginatedParams,
    ReadResourceParams,
    RequestParams,
    SetLevelParams,
)
from bastion.protocol.versions import HANDSHAKE_VERSIONS, LATEST_HANDSHAKE, SUPPORTED_VERSIONS
from bastion.ratelimit.forwarded import Target
from bastion.server.admission import Admission
from bastion.server.eras import is_input_required
from bastion.server.listen import Listeners
from bastion.server.relay import asker, relay
from bastion.server.request_audit import RequestAudit, RequestFacts
from bastion.server.resources import Resources, map_result_uris, public_contents
from bastion.server.rounds import Rounds, approval_question, approval_round
from bastion.server.scope import Scope
from bastion.server.state import ROUND_FIELDS, StateConfig, StateSealer
from bastion.uris import try_canonical

__all__ = ["SERVER_INFO", "Dispatcher", "Scope", "map_result_uris", "negotiate", "server_capabilities"]

log = structlog.get_logger("bastion.dispatch")

SERVER_INFO = {"name": "bastion", "title": "bastion MCP gateway", "version": __version__}
# Methods only one era has: 2026-07-28 dropped the session-era ones and added server/discover.
MODERN_ONLY = frozenset({m.DISCOVER})

# A handler gets the message's params object as the TypedDict of its method: every field optional and typed
# ``object`` (see ``bastion.protocol.messages``), so the view claims nothing the handler does not then check.
Handler = Callable[[Scope, Any, RequestId | None], Awaitable[dict[str, Any]]]
# A forwarded method other than tools/call: it tells ``RequestFacts`` what it learns, for its audit record.
Audited = Callable[[Scope, Any, RequestFacts], Awaitable[dict[str, Any]]]


def server_capabilities() -> dict[str, Any]:
    return {"tools": {"listChanged": True}, "prompts": {"listChanged": True},
            "resources": {"listChanged": True, "subscribe": True}, "completions": {}, "logging": {}}


def negotiate(requested: object) -> str:
    """Echo the client's version when bastion speaks it, else offer the latest legacy one (the client decides)."""
    return requested if isinstance(requested, str) and requested in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE


class Dispatcher:
    def __init__(self, gateway: Gateway, sealer: StateSealer | None = None) -> None:
        self.gw = gateway
        # requestState protection; without a configured key, a random per-process one (single replica only).
        self.sealer = sealer or StateSealer(StateConfig.from_mapping(None))
        self.rounds = Rounds(gateway, self.sealer)
        # The 2026-07-28 listen streams of this replica; here because resource subscriptions are shared between
        # them and the sessions' resources/subscribe (Resources counts both before unsubscribing upstream).
        self.listeners = Listeners(gateway.delivery, gateway.settings.sessions.max_per_principal)
        # Every request forwarded for a caller, other than tools/call (its pipeline has its own step), passes it.
        self.admission = Admission(gateway, gateway.forwarded_limits)
        # ... and gets its one ``request`` audit record, whatever its end.
        self.trail = RequestAudit(gateway)
        self.resources = Resources(gateway, self.admission, self.trail, self.rounds.upstream_is_modern,
                                   self.listeners.wanted_resources)
        self._handlers: dict[str, Handler] = {
            m.PING: self._ping,
            m.TOOLS_LIST: self._tools_list,
            m.TOOLS_CALL: self._tools_call,
            m.PROMPTS_LIST: self._prompts_list,
            m.PROMPTS_GET: self._audited(m.PROMPTS_GET, self._prompts_get),
            m.RESOURCES_LIST: self._resources_list,
            m.RESOURCE_TEMPLATES_LIST: self._templates_list,
            m.RESOURCES_READ: self._audited(m.RESOURCES_READ, self._resources_read),
            m.COMPLETE: self._audited(m.COMPLETE, self._complete),
            m.RESOURCES_SUBSCRIBE: self._audited(m.RESOURCES_SUBSCRIBE, self.resources.subscribe),
            m.RESOURCES_UNSUBSCRIBE: self._audited(m.RESOURCES_UNSUBSCRIBE, self.resources.unsubscribe),
            m.SET_LEVEL: self._set_level,
            m.DISCOVER: self._discover,
        }

    @property
    def methods(self) -> frozenset[str]:
        """Every method this table answers, in one era or the other."""
        return frozenset(self._handlers)

    def knows(self, method: str, era: Era) -> bool:
        if era == "modern":
            return method in self._handlers and method not in m.HANDSHAKE_ONLY
        return method in self._handlers and method not in MODERN_ONLY

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

    async def listen_resources(self, scope: Scope, uris: Iterable[str],
                               rid: RequestId | None = None) -> frozenset[str]:
        """Subscribe upstream to the resources a listen request names (``Resources.listen``)."""
        return await self.resources.listen(scope, uris, rid)

    async def release_resources(self, uris: Iterable[str], still_wanted: set[str]) -> None:
        """Unsubscribe upstream from resources nobody on this replica wants any more (``Resources.release``)."""
        await self.resources.release(uris, still_wanted)

    def _audited(self, method: str, body: Audited) -> Handler:
        """``body`` run by ``RequestAudit``: one ``request`` record per request, written before the answer."""
        async def handler(scope: Scope, params: Any, rid: RequestId | None) -> dict[str, Any]:
            traceparent = self._traceparent(scope, jsonrpc.obj(params.get("_meta")))
            return await self.trail.run(scope, method, rid, traceparent,
                                        lambda facts: body(scope, params, facts))
        return handler

    def _traceparent(self, scope: Scope, meta: Mapping[str, Any]) -> str | None:
        """The trace context an audit record joins: bastion's own span when tracing is on, else the client's."""
        own = self.gw.tracing.traceparent()
        if own is not None:
            return own
        sent = meta.get("traceparent")
        return sent if isinstance(sent, str) else scope.traceparent

    # -- local answers --------------------------------------------------------------------------------------

    async def _ping(self, scope: Scope, params: RequestParams, rid: RequestId | None) -> dict[str, Any]:
        return {}

    async def _set_level(self, scope: Scope, params: SetLevelParams, rid: RequestId | None) -> dict[str, Any]:
        level = params.get("level")
        if level not in m.LOG_LEVELS:
            raise InvalidParams(f"Invalid log level: must be one of {', '.join(m.LOG_LEVELS)}")
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

    async def _discover(self, scope: Scope, params: RequestParams, rid: RequestId | None) -> dict[str, Any]:
        result: dict[str, Any] = {"supportedVersions": list(SUPPORTED_VERSIONS),
                                  "capabilities": server_capabilities()}
        if self.gw.view.instructions:
            result["instructions"] = self.gw.view.instructions
        return self._cache_hints(scope, result, public_ttl_ms=60_000)

    def _cache_hints(self, scope: Scope, result: dict[str, Any], public_ttl_ms: int = 30_000) -> dict[str, Any]:
        if scope.era == "modern":
            # What a caller sees depends on who it is as soon as a policy filters lists: never a shared cache.
            # server/discover included: it answers after authentication, from the same gateway that filters the
            # lists, and a shared cache keyed on the URL alone would serve it across principals.
            result["ttlMs"] = 0 if self.gw.access.per_principal else public_ttl_ms
            result["cacheScope"] = "private" if self.gw.access.per_principal else "public"
        return result

    # -- tools ----------------------------------------------------------------------------------------------

    async def _tools_list(self, scope: Scope, params: PaginatedParams, rid: RequestId | None) -> dict[str, Any]:
        listing = self.gw.listings.listing(self.gw.view, self.gw.access, scope.principal)
        if params.get("cursor") is None:
            # One record per listing (its first page), saying how much the policy hid from this caller.
            await self.gw.emit_audit(tools_list_record(
                at=time.time(), shown=len(listing.tools), hidden=listing.hidden,
                request_id=rid,
                session=scope.session.id if scope.session else None, era=scope.era, principal=scope.principal,
                client_info=scope.client_info, traceparent=self._traceparent(scope, jsonrpc.obj(params.get("_meta"))),
                upstreams_failed=[n for n, up in self.gw.pool.health().items() if not up]))
        # The page comes pre-encoded (a tuple of orjson.Fragment): the response encoder copies each tool as is.
        tools, next_cursor = listing.page(params.get("cursor"), self.gw.settings.catalogue.page_size)
        result: dict[str, Any] = {"tools": tools}
        if next_cursor is not None:
            result["nextCursor"] = next_cursor
        return self._cache_hints(scope, result)

    async def _tools_call(self, scope: Scope, params: CallToolParams, rid: RequestId | None) -> dict[str, Any]:
        name = params.get("name")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        session_id = scope.session.id if scope.session else None
        meta = jsonrpc.obj(params.get("_meta"))
        if not isinstance(name, str) or not isinstance(arguments, dict):
            problem = "tools/call requires a string 'name'" if not isinstance(name, str) else \
                "tools/call 'arguments' must be an object"
            refusal = InvalidParams(problem)
            await self.gw.audit_refused_call(scope.principal, name if isinstance(name, str) else "", arguments,
                                             era=scope.era, session_id=session_id, client_info=scope.client_info,
                                             request_id=rid, stage="parse", outcome="invalid_input",
                                             reason=problem, error=refusal,
                                             traceparent=self._traceparent(scope, meta))
            raise refusal
        entry = self.gw.view.catalogue.tool(name)
        if entry is None:
            await self.gw.audit_unknown_tool(scope.principal, name, arguments, era=scope.era,
                                             session_id=session_id, client_info=scope.client_info,
                                             request_id=rid, traceparent=self._traceparent(scope, meta))
            raise UnknownTool(name)
        ctx = CallContext(
            request_id=self.gw.call_ids.next(), principal=scope.principal, tool=entry, arguments=arguments,
            era=scope.era, session_id=session_id,
            client_info=dict(scope.client_info) if scope.client_info else None,
            traceparent=self._traceparent(scope, meta),
            client_id=rid, ask_client=asker(scope),
        )
        progress_token = meta.get("progressToken")
        if "requestState" in params and not self.gw.access.tool_visible(scope.principal, entry):
            # A tool this caller may not see answers exactly as an unknown one does, and the requestState check
            # below would tell the two apart (it needs the tool's upstream): the check runs for visible tools only.
            # A plain call to a hidden tool gets the same answer from the policy guard.
            await self.gw.audit_refused_call(scope.principal, entry, arguments, era=scope.era,
                                             session_id=session_id, client_info=scope.client_info,
                                             request_id=rid, stage="resolve", outcome="denied",
                                             reason="tool not visible to the caller", error=UnknownTool(name),
                                             traceparent=ctx.traceparent)
            raise UnknownTool(name)
        try:
            trip = self.rounds.open(scope, m.TOOLS_CALL, name, params, entry.upstream)
        except ProtocolError as exc:
            # A retry whose requestState bastion cannot verify is refused before the pipeline: still a call.
            await self.gw.audit_refused_call(scope.principal, entry, arguments, era=scope.era,
                                             session_id=session_id, client_info=scope.client_info,
                                             request_id=rid, stage="resolve", outcome="denied",
                                             reason=exc.message, error=exc, traceparent=ctx.traceparent)
            raise
        if scope.era == "modern":
            ctx = ctx._replace(approval_round=approval_round(scope, params, trip))
        marker: list[str] = []

        async def forward(ctx: CallContext, record: CallRecord) -> dict[str, Any]:
            if record.approval_question is not None:
                # bastion's own question (an approve rule), asked instead of forwarding.
                marker.append(f"ask:{record.rule_id}")
                return approval_question(record.approval_question)
            if record.approval is not None and record.approval.get("outcome") == "approved":
                marker.append(f"ok:{record.rule_id}")  # later rounds of this request need not ask again
            fwd: dict[str, Any] = {"name": entry.original_name, "arguments": ctx.arguments}
            return await self.rounds.forward(scope, entry.upstream, m.TOOLS_CALL, fwd, meta, params, trip,
                                             relay(self.gw, scope, entry.upstream, progress_token))

        result = await self.gw.pipeline.run(ctx, forward)
        if is_input_required(result):
            return self.rounds.input_required(scope, m.TOOLS_CALL, name, params, entry.upstream, result,
                                              approval=marker[-1] if marker else None)
        # After the guards: they judge (and the sanitizer vets) the URIs exactly as the upstream sent them.
        return map_result_uris(result, self.gw.upstream_of(entry.upstream).prefix)

    # -- prompts --------------------------------------------------------------------------------------------

    async def _prompts_list(self, scope: Scope, params: PaginatedParams, rid: RequestId | None) -> dict[str, Any]:
        visible = [p for p in self.gw.view.catalogue.prompts
                   if self.gw.access.prompt_visible(scope.principal, p.upstream, p.public_name)]
        start, end, nxt = cat.page([p.public_name for p in visible], params.get("cursor"),
                                   self.gw.settings.catalogue.page_size)
        result: dict[str, Any] = {"prompts": [dict(p.definition) for p in visible[start:end]]}
        if nxt is not None:
            result["nextCursor"] = nxt
        return self._cache_hints(scope, result)

    async def _prompts_get(self, scope: Scope, params: GetPromptParams, facts: RequestFacts) -> dict[str, Any]:
        name = params.get("name")
        facts.asked(name=name if isinstance(name, str) else None)
        entry = self.gw.view.catalogue.prompt(name) if isinstance(name, str) else None
        allowance = self.gw.access.prompt_allowance(scope.principal, entry.upstream, entry.public_name) \
            if entry is not None else None
        if entry is None or allowance is None:
            facts.reason = "unknown prompt" if entry is None else "prompt not visible to the caller"
            raise InvalidParams(f"Unknown prompt: {name}")
        facts.resolved(entry.upstream, entry.original_name, name=entry.public_name)
        trip = self.rounds.open(scope, m.PROMPTS_GET, entry.public_name, params, entry.upstream)
        fwd = {k: v for k, v in params.items() if k not in ROUND_FIELDS}
        fwd["name"] = entry.original_name
        meta = jsonrpc.obj(params.get("_meta"))
        async with self.admission.held(scope, m.PROMPTS_GET, Target.prompt(entry.public_name, entry.upstream),
                                       allowance, facts):
            result = await self.rounds.forward(scope, entry.upstream, m.PROMPTS_GET, fwd, meta, params, trip,
                                               relay(self.gw, scope, entry.upstream, meta.get("progressToken")))
        if is_input_required(result):
            return self.rounds.input_required(scope, m.PROMPTS_GET, entry.public_name, params, entry.upstream,
                                              result)
        return self.gw.clean_result(entry.upstream, m.PROMPTS_GET, result)

    # -- resources ------------------------------------------------------------------------------------------

    async def _resources_list(self, scope: Scope, params: PaginatedParams,
                              rid: RequestId | None) -> dict[str, Any]:
        return self._list_resources(scope, params, self.gw.view.catalogue.resources, "uri", "resources")

    async def _templates_list(self, scope: Scope, params: PaginatedParams,
                              rid: RequestId | None) -> dict[str, Any]:
        return self._list_resources(scope, params, self.gw.view.catalogue.templates, "uriTemplate",
                                    "resourceTemplates")

    def _list_resources(self, scope: Scope, params: PaginatedParams,
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

    async def _resources_read(self, scope: Scope, params: ReadResourceParams,
                              facts: RequestFacts) -> dict[str, Any]:
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise InvalidParams("resources/read requires a string 'uri'")
        routed = self.resources.route_visible(scope, uri, facts)
        upstream = routed.upstream
        trip = self.rounds.open(scope, m.RESOURCES_READ, uri, params, upstream)
        fwd = {k: v for k, v in params.items() if k not in ROUND_FIELDS}
        fwd["uri"] = routed.original
        meta = jsonrpc.obj(params.get("_meta"))
        async with self.resources.held(scope, m.RESOURCES_READ, routed, facts):
            result = await self.rounds.forward(scope, upstream, m.RESOURCES_READ, fwd, meta, params, trip,
                                               relay(self.gw, scope, upstream, meta.get("progressToken")))
        if is_input_required(result):
            return self.rounds.input_required(scope, m.RESOURCES_READ, uri, params, upstream, result)
        result = self.gw.clean_result(upstream, m.RESOURCES_READ, result)
        public_contents(result, self.gw.upstream_of(upstream).prefix)
        return self._cache_hints(scope, result)

    # -- completion -----------------------------------------------------------------------------------------

    async def _complete(self, scope: Scope, params: CompleteParams, facts: RequestFacts) -> dict[str, Any]:
        raw_ref = params.get("ref")
        if not isinstance(raw_ref, dict):
            raise InvalidParams("completion/complete requires a 'ref' object")
        ref = cast(CompletionRef, raw_ref)
        if ref.get("type") == "ref/prompt":
            name = ref.get("name")
            facts.asked(name=name if isinstance(name, str) else None)
            entry = self.gw.view.catalogue.prompt(name) if isinstance(name, str) else None
            allowance = self.gw.access.prompt_allowance(scope.principal, entry.upstream, entry.public_name) \
                if entry is not None else None
            if entry is None or allowance is None:
                facts.reason = "unknown prompt" if entry is None else "prompt not visible to the caller"
                raise InvalidParams(f"Unknown prompt: {name}")
            facts.resolved(entry.upstream, entry.original_name, name=entry.public_name)
            upstream, upstream_ref = entry.upstream, {**ref, "name": entry.original_name}
            target = Target.prompt(entry.public_name, upstream)
        elif ref.get("type") == "ref/resource":
            uri = ref.get("uri")
            # Judged and forwarded in canonical form, like every resource URI (``bastion.uris``).
            canonical = try_canonical(uri) if isinstance(uri, str) else None
            facts.asked(uri=canonical if canonical is not None else uri if isinstance(uri, str) else None)
            routed = cat.route_uri(self.gw.view.catalogue, canonical, self.gw.unprefixed) \
                if canonical is not None else None
            allowance = self.gw.access.resource_allowance(scope.principal, routed[0], canonical or "") \
                if routed is not None else None
            if routed is None or allowance is None:
                facts.reason = "unknown resource template" if routed is None else \
                    "resource template not visible to the caller"
                raise InvalidParams(f"Unknown resource template: {uri}")
            facts.resolved(routed[0], routed[1], uri=canonical)
            upstream, upstream_ref = routed[0], {**ref, "uri": routed[1]}
            target = Target.resources(upstream)
        else:
            raise ProtocolError(INVALID_PARAMS, "ref.type must be ref/prompt or ref/resource")
        # The client's own envelope and round fields stay here, as for every other method (``Rounds``).
        fwd = {k: v for k, v in params.items() if k not in ROUND_FIELDS}
        fwd["ref"] = upstream_ref
        meta = jsonrpc.obj(params.get("_meta"))
        async with self.admission.held(scope, m.COMPLETE, target, allowance, facts):
            result = await self.rounds.forward_once(scope, upstream, m.COMPLETE, fwd, meta,
                                                    relay(self.gw, scope, upstream, meta.get("progressToken")))
        return self.gw.clean_result(upstream, m.COMPLETE, result)


def _span_target(method: str, params: Mapping[str, Any]) -> str | None:
    name = params.get("name") if method in (m.TOOLS_CALL, m.PROMPTS_GET) else None
    return name[:200] if isinstance(name, str) else None


def _span_attributes(scope: Scope, rid: RequestId | None) -> dict[str, str | int]:
    attrs: dict[str, str | int] = {"mcp.protocol.version": scope.protocol_version,
                                   "bastion.principal.id": scope.principal.id, "bastion.era": scope.era}
    if rid is not None:
        attrs["jsonrpc.request.id"] = str(rid)
    if scope.session is not None:
        attrs["mcp.session.id"] = scope.session.id
    return attrs
