"""The front door: MCP Streamable HTTP on one endpoint, both protocol eras. This module is the transport; the
eras' own rules live next door.

Order of checks on every request, and why:
0. Below this app, the HTTP protocol (``server/protocol.py``) has already enforced the header, request-target,
   framing and timing limits.
1. Header shape: a second copy of a header every reader must see once is refused (400), and every value loses
   the optional whitespace around it, so no two readers can disagree about a header.
2. Host, then Origin: DNS-rebinding and cross-site requests are refused before anything else, including
   authentication, so a hostile page cannot even probe credentials. The Host check is the listener's, not the
   endpoint's: it runs once per request ahead of routing, for every path (``server/asgi.py``, ``HostGuard``), so
   a request reaching this endpoint has passed it (steps 1 and 2's Host part run there, in this order).
3. POST only: the media type (415) and a declared length over the limit (413), before authentication: they
   need no credentials to judge, and an anonymous client should cost as little as possible.
   Every refusal of steps 0-3 is counted and audited (``server/refusals.py``).
4. Authentication: every request on its own (a session is never a credential). A failure is HTTP 401.
5. Body size while reading it, then JSON parsing.
6. Era: ``initialize`` opens a legacy session; a request whose ``_meta`` carries a protocol version is served
   statelessly (2026-07-28); otherwise a legacy session id is required.
7. Session: unknown id, or an id opened by another principal, is 404 (indistinguishable on purpose).

Who does what after step 6, each in its own module because each changes for its own reasons:

- ``server/lifecycle.py``: the session-based revisions: ``initialize``, the session lookup (step 7), messages
  within a session, batches, the GET stream and ``DELETE``;
- ``server/modern.py``: the 2026-07-28 revision: its envelope and header checks, and ``subscriptions/listen``;
- ``server/responder.py``: running a request through ``Dispatcher`` into an ``Answer`` (``server/answer.py``:
  body, HTTP status, headers), and choosing JSON or SSE for it.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping
from functools import cached_property
from typing import Any

import structlog
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from bastion import jsonrpc, strictjson
from bastion.delivery import list_changes
from bastion.errors import INVALID_PARAMS, REQUEST_TOO_LARGE, HttpError, MessageRejected, ProtocolError, Refused
from bastion.gateway import Gateway
from bastion.jsonrpc import RequestId
from bastion.principal import Principal
from bastion.protocol.meta import PROTOCOL_VERSION_KEY
from bastion.protocol.methods import INITIALIZE
from bastion.server import dispatch as d
from bastion.server.answer import Answer, http_error_response, json_response
from bastion.server.checks import (
    FRONT_LINES,
    AcceptCheck,
    FrontHeaders,
    check_content_type,
    check_declared_length,
    check_origin,
    front_lines,
)
from bastion.server.lifecycle import SessionEvent, SessionLifecycle
from bastion.server.modern import ModernDoor, is_modern
from bastion.server.protocol import deliver, whole_body
from bastion.server.responder import Responder
from bastion.server.standing import AUTH_EPOCH, AuthChanges, OnRevoked, Reauthenticate, standing_of
from bastion.view import View

__all__ = ["Authenticate", "McpEndpoint", "OnRefused", "SessionEvent", "answered"]

log = structlog.get_logger("bastion.http")

# (request headers, client address) -> principal; the address is for the audit record of a failure only.
Authenticate = Callable[[Mapping[str, str], str | None], Awaitable[Principal]]
# (refusal, remote address, method, path, traceparent): counts and audits a refusal (RefusalReporter.report).
OnRefused = Callable[[Refused, str | None, str | None, str | None, str | None], None]


async def answered(rid: RequestId | None, work: Awaitable[Response]) -> Response:
    """``work``'s response, or the JSON-RPC error it raised answered with ``rid``, the id of the request it serves.

    Every error of one request belongs to that request: once its id has been read, no error may reach a handler
    that no longer knows it (the front door's last ``except ProtocolError`` answers ``id: null``, which is right
    only for what has no id: a body that could not be read, a GET or a DELETE). ``HttpError`` passes through:
    it refuses the HTTP request itself, and is answered as such.
    """
    try:
        return await work
    except ProtocolError as exc:
        return Answer.error(rid, exc).response()


class McpEndpoint:
    """ASGI app for the MCP endpoint path."""

    def __init__(self, gateway: Gateway, dispatcher: d.Dispatcher, authenticate: Authenticate,
                 on_session: SessionEvent | None = None, on_refused: OnRefused | None = None,
                 reauthenticate: Reauthenticate | None = None, on_revoked: OnRevoked | None = None,
                 auth_changes: AuthChanges | None = None) -> None:
        self.gw = gateway
        # How a stream re-checks the credential it was opened with (``server/standing.py``), at once when
        # ``auth_changes`` counts a change of what the authenticator consults (a reloaded key table).
        self.standing = standing_of(reauthenticate, on_revoked, auth_changes)
        self._auth_changes = auth_changes
        self.on_refused = on_refused
        self.dispatcher = dispatcher
        self.authenticate = authenticate
        self.listen = gateway.settings.listen
        self._accepts = AcceptCheck()
        self.on_session = on_session
        self._ids = itertools.count(1)
        self.listeners = dispatcher.listeners
        gateway.changes.subscribe(self._announce, self.listeners.resource_updated)

    # The rooms behind the door, each built on first use from the collaborators the constructor took.

    @cached_property
    def _responder(self) -> Responder:
        return Responder(self.gw, self.dispatcher, self._ids)

    @cached_property
    def _sessions(self) -> SessionLifecycle:
        return SessionLifecycle(self.gw, self.dispatcher, self._responder, self.on_session, self.standing)

    @cached_property
    def _modern(self) -> ModernDoor:
        return ModernDoor(self.gw, self.dispatcher, self._responder, self.listeners, self.standing)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            # Gathered while the head was parsed (server/protocol.py), or now under another server.
            lines = scope.get(FRONT_LINES) or front_lines(scope["headers"])
            scope["headers"] = lines.checked()
            # What request.headers would build on first use (starlette caches it in ``_headers``), with cheaper
            # lookups; should starlette ever rename it, request.headers is simply starlette's own again.
            request._headers = FrontHeaders(lines.lines, lines.first)
            response = await self._serve(request)
        except ClientDisconnect:
            # The client went away before its request was whole (or the protocol's request deadline closed it):
            # nothing to answer and nothing had started; an ordinary event on an edge, not an error.
            log.debug("http.client_disconnected", method=scope.get("method"), stage="body")
            return
        except Refused as exc:
            self._refused(exc, scope)
            response = http_error_response(exc)
        except HttpError as exc:
            if exc.log_detail:
                log.info("http.refused", status=exc.status, reason=exc.message, detail=exc.log_detail)
            response = http_error_response(exc)
        except ProtocolError as exc:
            # Only what has no request id reaches here (a GET, a DELETE): every POST whose id was read answers its
            # own errors with it (``answered``).
            response = json_response(jsonrpc.error(None, exc), exc.http_status)
        except Exception:
            # A bug. Nothing was sent yet: answer as starlette's error middleware does (the endpoint is served
            # ahead of it, server/asgi.py), and raise for the server to log and close the connection.
            await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
            raise
        await deliver(response, scope, receive, send)

    def _refused(self, exc: Refused, scope: AsgiScope) -> None:
        if self.on_refused is None:
            return
        client = scope.get("client")
        traceparent = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"traceparent"), None)
        self.on_refused(exc, client[0] if client else None, scope.get("method"), scope.get("path"), traceparent)

    async def _serve(self, request: Request) -> Response:
        headers = request.headers
        # Host was checked ahead of routing (server/asgi.py, HostGuard), once for every path.
        check_origin(headers.get("origin"), self.listen)
        if request.method == "POST":
            check_content_type(headers.get("content-type"))
            check_declared_length(headers.get("content-length"), self.listen.max_body_bytes)
        if self._auth_changes is not None:
            # Before authenticating: a stream this request opens checks again after any later change.
            request.scope[AUTH_EPOCH] = self._auth_changes.number
        principal = await self.authenticate(headers, request.client.host if request.client else None)
        if request.method == "POST":
            return await self._post(request, principal)
        if request.method == "GET":
            if headers.get("mcp-session-id") is None:
                # No legacy session: the 2026-07-28 revision has no GET stream.
                raise HttpError(405, "Method Not Allowed: GET needs a legacy session", headers={"Allow": "POST"})
            _, sse_ok = self._accepts(headers.get("accept"))
            return await self._sessions.stream(request, principal, sse_ok)
        if request.method == "DELETE":
            if headers.get("mcp-session-id") is None:
                raise HttpError(405, "Method Not Allowed: DELETE needs a legacy session", headers={"Allow": "POST"})
            return (await self._sessions.close(request, principal)).response()
        raise HttpError(405, "Method Not Allowed", headers={"Allow": "GET, POST, DELETE"})

    # -- POST -----------------------------------------------------------------------------------------------

    async def _read_body(self, request: Request) -> bytes:
        limit = self.listen.max_body_bytes
        body = whole_body(request.receive)
        if body is not None:
            # All of it arrived with the head (the common case under bastion's own HTTP protocol).
            if len(body) > limit:
                raise Refused(413, "Request body too large", reason="body_too_large", code=REQUEST_TOO_LARGE,
                              log_detail=f"streamed body over {limit} bytes")
            return body
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                # Chunked bodies declare no length: refused when the limit is crossed, without reading on.
                raise Refused(413, "Request body too large", reason="body_too_large", code=REQUEST_TOO_LARGE,
                              log_detail=f"streamed body over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _post(self, request: Request, principal: Principal) -> Response:
        json_ok, sse_ok = self._accepts(request.headers.get("accept"))
        if not json_ok:
            # Every POST can be answered in JSON, and is unless the client also accepts a stream: a client that
            # refuses JSON (the revisions require both types in a POST's Accept) is one bastion cannot answer.
            raise HttpError(406, "Not Acceptable: Accept must include application/json (and text/event-stream "
                                 "for streamed answers)")
        try:
            doc = jsonrpc.parse(await self._read_body(request), self.listen.max_json_depth)
        except MessageRejected as exc:
            return self._rejected(exc)
        body = doc.value
        if isinstance(body, list):
            return (await self._sessions.batch(request, principal, body, doc)).response()
        try:
            msg = jsonrpc.classify(body, doc.flaw(body))
        except MessageRejected as exc:
            return await answered(exc.request_id, self._refuse_rejected(principal, body, exc, doc))
        # From here the request's id is known: a JSON-RPC error raised on any path below, even one no handler
        # there expected (an audit record that could not be written under ``audit.required``), answers it.
        return await answered(msg.id if msg.kind == "request" else None,
                              self._message(request, principal, msg, sse_ok))

    async def _refuse_rejected(self, principal: Principal, body: Any, exc: MessageRejected,
                               doc: strictjson.Document) -> Response:
        await self._responder.audit_rejected(principal, body, exc, cut=doc.cut)
        return self._rejected(exc)

    async def _message(self, request: Request, principal: Principal, msg: jsonrpc.Message,
                       sse_ok: bool) -> Response:
        # The era first: a request carrying 2026-07-28 _meta is stateless whatever its method, so an `initialize`
        # in that shape gets the modern answer to an unknown method, not a session.
        meta = msg.params.get("_meta")
        if is_modern(meta):
            return await self._modern.serve(request, principal, msg, meta, sse_ok)
        if msg.kind == "request" and msg.method == INITIALIZE:
            return (await self._sessions.initialize(principal, msg)).response()
        if request.headers.get("mcp-session-id") is None and msg.kind == "request":
            # Neither a session nor the per-request metadata: 400 for both eras, in the shape a 2026-07-28 client
            # expects (its request id, -32602), so it can fix and retry; a legacy client reads the 400.
            err = ProtocolError(INVALID_PARAMS, f"Missing Mcp-Session-Id header, or the required _meta field "
                                f"{PROTOCOL_VERSION_KEY}", http_status=400)
            await self._responder.audit_refused(principal, msg, err)
            return Answer.error(msg.id, err).response()
        return await self._sessions.serve(request, principal, msg, sse_ok)

    @staticmethod
    def _rejected(exc: MessageRejected) -> Response:
        if exc.log_detail:
            log.info("request.rejected", code=exc.code, reason=exc.message, detail=exc.log_detail[:500])
        return Answer.error(exc.request_id, exc).response()

    async def _announce(self, changed: list[str], old: View, new: View) -> None:
        """Relay list changes to every legacy session listening on a GET stream of this replica, and to the
        modern listen streams that opted into them: each only if an entry that changed between the two views is
        one its principal may see under the policy in force (``bastion.delivery``)."""
        found = list_changes(old, new, changed)
        self.listeners.lists_changed(found)
        self._sessions.lists_changed(found)
