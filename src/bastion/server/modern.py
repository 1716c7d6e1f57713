"""The 2026-07-28 revision at the front door: stateless requests, their headers, and the listen stream.

A modern request carries its whole envelope in ``params._meta`` (version, client capabilities and identity, log
level) and mirrors its routing fields into HTTP headers; there is no session, no ``initialize`` and no GET
stream. Before a request reaches the method table it passes, in the reference SDK's order so a client sees the
same error for the same defect: the envelope's presence (-32602), the headers mirroring the body (-32020,
``server/headers.py``), the version (-32022), the log level. Mcp-Session-Id and Last-Event-ID mean nothing here
and are ignored; no session id is ever minted or echoed. Every refusal is a JSON-RPC error with the request's id
and the status this revision pins (400, or 404 for an unknown method).

``subscriptions/listen`` replaces the GET stream: one long-lived request whose SSE response carries only what the
client opted into (``server/listen.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeGuard, cast

import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from bastion import jsonrpc
from bastion.errors import INVALID_PARAMS, UNSUPPORTED_PROTOCOL_VERSION, HttpError, ProtocolError
from bastion.gateway import Gateway
from bastion.principal import Principal
from bastion.protocol.capabilities import checked_capabilities
from bastion.protocol.messages import ListenParams
from bastion.protocol.meta import CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY, LOG_LEVEL_KEY, PROTOCOL_VERSION_KEY
from bastion.protocol.methods import ACKNOWLEDGED, LISTEN, LOG_LEVELS, TOOLS_CALL
from bastion.protocol.versions import MODERN_VERSIONS, SUPPORTED_VERSIONS
from bastion.server.answer import KEEPALIVE_S, SSE_HEADERS, Answer
from bastion.server.dispatch import Dispatcher
from bastion.server.emitter import Emitter
from bastion.server.headers import check_request_headers
from bastion.server.listen import Listeners, ListenFilter, Stream, tagged
from bastion.server.responder import Responder
from bastion.server.scope import Scope
from bastion.server.standing import Standing, StandingOf
from bastion.server.stream_clock import Idle, next_message
from bastion.sse import encode_event

__all__ = ["ModernDoor", "is_modern"]

log = structlog.get_logger("bastion.http")


def is_modern(meta: object) -> TypeGuard[dict[str, Any]]:
    """Whether a message's ``_meta`` makes it a 2026-07-28 request: it names a protocol version, whatever the
    method (an ``initialize`` in that shape gets the modern answer to an unknown method, not a session)."""
    return isinstance(meta, dict) and PROTOCOL_VERSION_KEY in meta


class ModernDoor:
    def __init__(self, gateway: Gateway, dispatcher: Dispatcher, responder: Responder,
                 listeners: Listeners, standing: StandingOf) -> None:
        self.gw = gateway
        self.standing = standing
        self.dispatcher = dispatcher
        self.responder = responder
        self.listeners = listeners

    async def serve(self, request: Request, principal: Principal, msg: jsonrpc.Message, meta: dict[str, Any],
                    sse_ok: bool) -> Response:
        try:
            admitted = self._admit(request, principal, msg, meta,
                                   self.responder.emitter("modern", msg, None, sse_ok))
        except ProtocolError as exc:
            await self.responder.audit_refused(principal, msg, exc)
            return Answer.error(msg.id, exc).response()
        if admitted is None:
            return Answer.empty(202).response()
        if msg.method == LISTEN:
            try:
                return await self._listen(admitted, msg, sse_ok, request)
            except ProtocolError as exc:
                return Answer.error(msg.id, exc).response()
        if not self.dispatcher.knows(msg.method, "modern"):
            return Answer.error(msg.id, ProtocolError(-32601, f"Method not found: {msg.method}", http_status=404))\
                .response()
        # The request's own receive: losing its connection before the answer leaves cancels it (``Responder.run``).
        return await self.responder.respond(admitted, msg, None, sse_ok, request.receive)

    def _admit(self, request: Request, principal: Principal, msg: jsonrpc.Message,
               meta: Mapping[str, Any], emitter: Emitter) -> Scope | None:
        """The request's ``Scope``, or ``None`` for a notification (202). A refusal raises ``ProtocolError``, so
        ``serve`` answers and audits every one of them in one place."""
        version = meta.get(PROTOCOL_VERSION_KEY)
        caps = meta.get(CLIENT_CAPABILITIES_KEY)
        if caps is None:
            raise ProtocolError(INVALID_PARAMS, f"Missing required _meta field {CLIENT_CAPABILITIES_KEY}",
                                http_status=400)
        caps = checked_capabilities(caps, f"_meta.{CLIENT_CAPABILITIES_KEY}", http_status=400)
        if msg.kind == "request":
            try:
                check_request_headers(((k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw),
                                      version, msg.method, msg.params, self._input_schema(principal, msg))
            except ProtocolError as exc:
                log.info("request.header_mismatch", method=msg.method[:100], reason=exc.message)
                raise
        if version not in MODERN_VERSIONS:
            raise ProtocolError(UNSUPPORTED_PROTOCOL_VERSION, f"Unsupported protocol version: {version}",
                                data={"supported": list(SUPPORTED_VERSIONS), "requested": version}, http_status=400)
        if msg.kind != "request":
            return None
        info = jsonrpc.obj(meta.get(CLIENT_INFO_KEY)) or None
        level = meta.get(LOG_LEVEL_KEY)
        if level is not None and level not in LOG_LEVELS:
            raise ProtocolError(INVALID_PARAMS, "Invalid log level", http_status=400)
        return Scope(principal=principal, era="modern", protocol_version=str(version), client_capabilities=caps,
                     client_info=info, emitter=emitter, log_level=level if isinstance(level, str) else None,
                     traceparent=request.headers.get("traceparent"), tracestate=request.headers.get("tracestate"))

    def _input_schema(self, principal: Principal, msg: jsonrpc.Message) -> Any:
        """The called tool's schema as this caller sees it (for ``Mcp-Param-*``), or ``None``.

        A tool the caller may not see validates nothing here: the call itself reports it as unknown, so the
        header check cannot become an oracle for hidden tools.
        """
        name = msg.params.get("name")
        if msg.method != TOOLS_CALL or not isinstance(name, str):
            return None
        view = self.gw.view
        entry = view.catalogue.tool(name)
        if entry is None or name in view.quarantined or not self.gw.access.tool_visible(principal, entry):
            return None
        return entry.definition.get("inputSchema")

    async def _listen(self, scope: Scope, msg: jsonrpc.Message, sse_ok: bool, request: Request) -> Response:
        """``subscriptions/listen``: acknowledgement first, then only what the client opted into, each message
        tagged with the listen request's id, keep-alive comments in between, until the client goes away or the
        credential it was opened with no longer authenticates its principal (``server/standing.py``: checked at
        each keep-alive tick and at a JWT's ``exp``; a principal whose groups or attributes changed listens on as
        the principal it is now)."""
        if not sse_ok:
            raise HttpError(406, "Not Acceptable: subscriptions/listen answers with text/event-stream")
        assert msg.id is not None
        wanted = ListenFilter.from_params(cast(ListenParams, msg.params))
        resources = await self.dispatcher.listen_resources(scope, wanted.resources, msg.id)
        stream = Stream(msg.id, scope.principal, ListenFilter(lists=wanted.lists, resources=resources))
        standing = self.standing(scope.principal, request, "modern", None)
        for ended in self.listeners.open(stream):
            log.warning("listen.evicted", principal=scope.principal.id, subscription=str(ended.subscription_id)[:64])
        ack = tagged(ACKNOWLEDGED, {"notifications": stream.filter.honoured()}, msg.id)
        log.info("listen.open", principal=scope.principal.id, lists=sorted(stream.filter.lists),
                 resources=len(resources))

        async def events() -> AsyncIterator[bytes]:
            try:
                yield encode_event(jsonrpc.dumps(ack), event="message")
                while True:
                    item = await next_message(stream.queue.get, KEEPALIVE_S, standing.principal.expires_at,
                                              standing.recheck)
                    if item is Idle.TICK or item is Idle.EXPIRED:
                        # At each tick, and at the credential's expiry (after which nothing more is delivered).
                        if not await self._still_standing(stream, standing):
                            return
                        yield b": keep-alive\n\n"
                        continue
                    if item is None:  # ended by bastion (a stalled reader): the client re-listens and refetches
                        return
                    yield encode_event(jsonrpc.dumps(item), event="message")
            finally:
                self.listeners.close(stream)
                with contextlib.suppress(Exception):
                    await self.dispatcher.release_resources(stream.filter.resources,
                                                            self.listeners.wanted_resources())
                log.info("listen.closed", principal=scope.principal.id)

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def _still_standing(self, stream: Stream, standing: Standing) -> bool:
        """Whether the listen stream's credential still authenticates its principal; the stream hears every later
        message as the principal it is now."""
        verdict = await standing.check()
        if verdict.ended is None:
            stream.principal = verdict.principal
            return True
        log.info("listen.ended", principal=verdict.principal.id, reason=verdict.ended, detail=verdict.detail)
        return False
