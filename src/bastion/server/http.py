"""The front door: MCP Streamable HTTP on one endpoint, both protocol eras.

Order of checks on every request, and why:
0. Below this app, the HTTP protocol (``server/protocol.py``) has already enforced the header, request-target,
   framing and timing limits.
1. Header shape: a second copy of a header every reader must see once is refused (400), and every value loses
   the optional whitespace around it, so no two readers can disagree about a header.
2. Host, then Origin: DNS-rebinding and cross-site requests are refused before anything else, including
   authentication, so a hostile page cannot even probe credentials.
3. POST only: the media type (415) and a declared length over the limit (413), before authentication: they
   need no credentials to judge, and an anonymous client should cost as little as possible.
   Every refusal of steps 0-3 is counted and audited (``server/refusals.py``).
4. Authentication: every request on its own (a session is never a credential). A failure is HTTP 401.
5. Body size while reading it, then JSON parsing.
6. Era: ``initialize`` opens a legacy session; a request whose ``_meta`` carries a protocol version is served
   statelessly (2026-07-28); otherwise a legacy session id is required.
7. Session: unknown id, or an id opened by another principal, is 404 (indistinguishable on purpose).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

import structlog
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from bastion import jsonrpc, strictjson
from bastion.errors import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MISSING_CLIENT_CAPABILITY,
    REQUEST_TOO_LARGE,
    UNSUPPORTED_PROTOCOL_VERSION,
    HttpError,
    MessageRejected,
    ProtocolError,
    Refused,
    RequestError,
)
from bastion.gateway import Gateway
from bastion.principal import Principal
from bastion.server import dispatch as d
from bastion.server.emitter import Emitter, NullEmitter, StreamEmitter
from bastion.server.eras import for_legacy, for_modern
from bastion.server.guards import (
    accepts,
    check_content_type,
    check_declared_length,
    check_host,
    check_origin,
    front_headers,
)
from bastion.server.headers import check_request_headers
from bastion.server.listen import ACKNOWLEDGED, Listeners, ListenFilter, Stream, tagged
from bastion.server.sessions import LiveSession, SessionData, new_session_id
from bastion.sse import encode_event

log = structlog.get_logger("bastion.http")

# (request headers, client address) -> principal; the address is for the audit record of a failure only.
Authenticate = Callable[[Mapping[str, str], str | None], Awaitable[Principal]]
SessionEvent = Callable[[str, SessionData, Principal], Awaitable[None]]
# (refusal, remote address, method, path, traceparent): counts and audits a refusal (RefusalReporter.report).
OnRefused = Callable[[Refused, str | None, str | None, str | None, str | None], None]
MODERN_ERROR_STATUS = {HEADER_MISMATCH: 400, MISSING_CLIENT_CAPABILITY: 400, UNSUPPORTED_PROTOCOL_VERSION: 400,
                       METHOD_NOT_FOUND: 404}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE_S = 15.0


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(jsonrpc.dumps(body), status_code=status, media_type="application/json",
                    headers=dict(headers or {}))


def http_error_response(exc: HttpError) -> Response:
    body = jsonrpc.error_body(exc.code if exc.code is not None else INVALID_REQUEST, exc.message, exc.data)
    return json_response(body, exc.status, exc.headers)


class McpEndpoint:
    """ASGI app for the MCP endpoint path."""

    def __init__(self, gateway: Gateway, dispatcher: d.Dispatcher, authenticate: Authenticate,
                 on_session: SessionEvent | None = None, on_refused: OnRefused | None = None) -> None:
        self.gw = gateway
        self.on_refused = on_refused
        self.dispatcher = dispatcher
        self.authenticate = authenticate
        self.listen = gateway.settings.listen
        self.on_session = on_session
        self._ids = itertools.count(1)
        self.listeners = Listeners()
        gateway.change_listeners.append(self._announce)
        gateway.resource_listeners.append(self.listeners.resource_updated)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            scope["headers"] = front_headers(scope["headers"])
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
            response = json_response(jsonrpc.error(None, exc), exc.http_status)
        await response(scope, receive, send)

    def _refused(self, exc: Refused, scope: AsgiScope) -> None:
        if self.on_refused is None:
            return
        client = scope.get("client")
        traceparent = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"traceparent"), None)
        self.on_refused(exc, client[0] if client else None, scope.get("method"), scope.get("path"), traceparent)

    async def _serve(self, request: Request) -> Response:
        headers = request.headers
        check_host(headers.get("host"), self.listen)
        check_origin(headers.get("origin"), self.listen)
        if request.method == "POST":
            check_content_type(headers.get("content-type"))
            check_declared_length(headers.get("content-length"), self.listen.max_body_bytes)
        principal = await self.authenticate(headers, request.client.host if request.client else None)
        if request.method == "POST":
            return await self._post(request, principal)
        if request.method == "GET":
            return await self._get(request, principal)
        if request.method == "DELETE":
            return await self._delete(request, principal)
        raise HttpError(405, "Method Not Allowed", headers={"Allow": "GET, POST, DELETE"})

    # -- sessions -------------------------------------------------------------------------------------------

    async def _session(self, request: Request, principal: Principal, *, required: bool) -> SessionData | None:
        sid = request.headers.get("mcp-session-id")
        if sid is None:
            if required:
                raise HttpError(400, "Bad Request: Mcp-Session-Id header is required")
            return None
        data = await self.gw.store.get(sid)
        # Another principal's session id is answered like an unknown one, so session ids cannot be probed.
        if data is None or data.principal_id != principal.id:
            raise HttpError(404, "Session not found", code=INVALID_REQUEST)
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version not in d.LEGACY_VERSIONS:
            raise HttpError(400, f"Bad Request: unsupported MCP-Protocol-Version {version[:40]!r}",
                            data={"supported": list(d.LEGACY_VERSIONS)})
        return data

    # -- POST -----------------------------------------------------------------------------------------------

    async def _read_body(self, request: Request) -> bytes:
        limit = self.listen.max_body_bytes
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
        json_ok, sse_ok = accepts(request.headers.get("accept"))
        if not (json_ok or sse_ok):
            raise HttpError(406, "Not Acceptable: Accept must include application/json or text/event-stream")
        try:
            doc = jsonrpc.parse(await self._read_body(request), self.listen.max_json_depth)
        except MessageRejected as exc:
            return self._rejected(exc)
        body = doc.value
        if isinstance(body, list):
            return await self._batch(request, principal, body, doc)
        try:
            msg = jsonrpc.classify(body, doc.flaw(body))
        except MessageRejected as exc:
            await self._audit_rejected_call(principal, body, exc, cut=doc.cut)
            return self._rejected(exc)

        # The era first: a request carrying 2026-07-28 _meta is stateless whatever its method, so an `initialize`
        # in that shape gets the modern answer to an unknown method, not a session.
        meta = msg.params.get("_meta")
        if isinstance(meta, dict) and d.META_VERSION in meta:
            return await self._modern(request, principal, msg, meta, sse_ok)
        if msg.kind == "request" and msg.method == "initialize":
            return await self._initialize(principal, msg)
        if request.headers.get("mcp-session-id") is None and msg.kind == "request":
            # Neither a session nor the per-request metadata: 400 for both eras, in the shape a 2026-07-28 client
            # expects (its request id, -32602), so it can fix and retry; a legacy client reads the 400.
            err = ProtocolError(INVALID_PARAMS, f"Missing Mcp-Session-Id header, or the required _meta field "
                                f"{d.META_VERSION}", http_status=400)
            return json_response(jsonrpc.error(msg.id, err), 400)
        session = await self._session(request, principal, required=True)
        assert session is not None
        return await self._legacy(request, principal, session, msg, sse_ok)

    @staticmethod
    def _rejected(exc: MessageRejected) -> Response:
        if exc.log_detail:
            log.info("request.rejected", code=exc.code, reason=exc.message, detail=exc.log_detail[:500])
        return json_response(jsonrpc.error(exc.request_id, exc), exc.http_status)

    async def _audit_rejected_call(self, principal: Principal, body: Any, exc: MessageRejected, *,
                                   cut: bool = False) -> None:
        """A tools/call the parser refused (arguments too deep, unrepresentable values) is still a call: it gets
        its one audit record. Its era is read from the body; its session is not recorded (not yet verified)."""
        if not isinstance(body, dict) or body.get("method") != "tools/call" or "id" not in body:
            return
        params = jsonrpc.obj(body.get("params"))
        meta = jsonrpc.obj(params.get("_meta"))
        name = params.get("name")
        await self.gw.audit_refused_call(
            principal, name if isinstance(name, str) else "", params.get("arguments"),
            era="modern" if d.META_VERSION in meta else "legacy", session_id=None, client_info=None,
            request_id=exc.request_id, stage="parse", outcome="invalid_input", reason=exc.message, error=exc,
            audit_error="arguments: nested past what the parser reads; the digest is of the arguments cut at the "
                        "depth limit" if cut else None)

    async def _initialize(self, principal: Principal, msg: jsonrpc.Message) -> Response:
        params = msg.params
        version = d.negotiate(params.get("protocolVersion"))
        caps = jsonrpc.obj(params.get("capabilities"))
        info = jsonrpc.obj(params.get("clientInfo"))
        data = SessionData(id=new_session_id(), principal_id=principal.id, protocol_version=version,
                           client_capabilities=caps,
                           client_info={k: info[k] for k in ("name", "version", "title") if k in info},
                           created_at=time.time())
        await self.gw.store.create(data)
        if self.on_session is not None:
            await self.on_session("session.start", data, principal)
        log.info("session.start", session=data.id[:8], principal=principal.id, version=version,
                 client=data.client_info.get("name"))
        return json_response(jsonrpc.result(msg.id, self.dispatcher.initialize_result(version)),
                             headers={"Mcp-Session-Id": data.id})

    async def _legacy(self, request: Request, principal: Principal, session: SessionData, msg: jsonrpc.Message,
                      sse_ok: bool) -> Response:
        live = self.gw.live.get(session.id)
        if msg.kind == "notification":
            await self._client_notification(session, live, msg)
            return Response(status_code=202)
        if msg.kind == "response":
            fut = live.pending.get(msg.raw.get("id"))
            if fut is not None and not fut.done():
                fut.set_result(msg.raw)
            return Response(status_code=202)
        scope = d.Scope(principal=principal, era="legacy", protocol_version=session.protocol_version,
                        client_capabilities=session.client_capabilities, client_info=session.client_info,
                        emitter=NullEmitter(), session=session, live=live, log_level=session.log_level,
                        traceparent=request.headers.get("traceparent"), tracestate=request.headers.get("tracestate"))
        return await self._respond(scope, msg, live, sse_ok)

    async def _client_notification(self, session: SessionData, live: LiveSession, msg: jsonrpc.Message) -> None:
        if msg.method == "notifications/initialized" and not session.initialized:
            await self.gw.store.update(replace(session, initialized=True))
        elif msg.method == "notifications/cancelled":
            task = live.inflight.get(msg.params.get("requestId"))
            if task is not None:
                task.cancel()

    async def _answer_json(self, scope: d.Scope, msg: jsonrpc.Message, live: LiveSession | None) -> Response:
        answer = await self._run(scope, msg, live)
        status = 200
        if "error" in answer and scope.era == "modern":
            status = answer.pop("_status", 200)
        answer.pop("_status", None)
        return json_response(answer, status)

    async def _run(self, scope: d.Scope, msg: jsonrpc.Message, live: LiveSession | None) -> dict[str, Any]:
        """Dispatch one request to a JSON-RPC response object; registered for cancellation while it runs."""
        task = asyncio.current_task()
        if live is not None and task is not None and msg.id is not None:
            live.inflight[msg.id] = task
        try:
            result = await self.dispatcher.handle(scope, msg)
            shaped = for_modern(result, d.SERVER_INFO) if scope.era == "modern" else for_legacy(result)
            return jsonrpc.result(msg.id, shaped)
        except ProtocolError as exc:
            if exc.log_detail:
                log.info("request.failed", method=msg.method, code=exc.code, detail=exc.log_detail)
            status = exc.http_status
            if scope.era == "modern" and status == 200:
                # The 2026-07-28 revision pins HTTP statuses to these codes, whoever raised them (an upstream's
                # relayed -32021 included).
                status = MODERN_ERROR_STATUS.get(exc.code, 200)
            return {**jsonrpc.error(msg.id, exc), "_status": status}
        except RequestError as exc:
            # Tool-plane errors become results inside the pipeline; an HttpError here is a bug in routing.
            log.error("request.unexpected_plane", method=msg.method, error=exc.message)
            return jsonrpc.error(msg.id, ProtocolError(-32603, "Internal error"))
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return jsonrpc.error(msg.id, ProtocolError(-32603, "Request cancelled"))
        except Exception:
            # A bug outside the pipeline (which records and answers its own failures): say "internal error" with
            # the request's id, not "cancelled", and leave the traceback in the log.
            log.error("request.crashed", method=msg.method[:100], exc_info=True)
            return jsonrpc.error(msg.id, ProtocolError(-32603, "Internal error"))
        finally:
            if live is not None and msg.id is not None:
                live.inflight.pop(msg.id, None)

    async def _respond(self, scope: d.Scope, msg: jsonrpc.Message, live: LiveSession | None,
                       sse_ok: bool) -> Response:
        """Answer with JSON unless something must reach the client before the answer.

        Only ``tools/call`` can make an upstream talk back mid-request (progress, log messages, sampling and
        elicitation requests). For it, the choice is made lazily: the call runs in a task, and the response
        becomes an SSE stream only if a message for the client comes before the result. A plain call answers with
        plain JSON, and a call that needs the stream gets it without the client having to guess.
        """
        if not sse_ok:
            return await self._answer_json(scope, msg, live)
        if msg.method != "tools/call":
            if scope.era == "modern":
                return await self._answer_json(scope, msg, live)
            # Legacy clients that accept SSE get it, as the SDK's own servers do (the conformance harness checks
            # that concurrent POST streams work); a one-event stream costs next to nothing off the call path.
            answer = await self._run(scope, msg, live)
            answer.pop("_status", None)
            return Response(encode_event(jsonrpc.dumps(answer), event="message"), media_type="text/event-stream",
                            headers=SSE_HEADERS)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        emitter: Emitter = StreamEmitter(queue, live if scope.era == "legacy" else None, self._ids)
        scope = replace(scope, emitter=emitter)
        final: list[dict[str, Any]] = []

        async def work() -> None:
            try:
                final.append(await self._run(scope, msg, live))
            finally:
                queue.put_nowait(None)

        task = asyncio.create_task(work(), name=f"bastion-call-{msg.id}")
        if live is not None and msg.id is not None:
            live.inflight[msg.id] = task
        first = await queue.get()
        if first is None:
            if not final:  # the task was cancelled (client sent notifications/cancelled)
                return json_response(jsonrpc.error(msg.id, ProtocolError(-32603, "Request cancelled")))
            answer = final[0]
            status = answer.pop("_status", 200) if scope.era == "modern" and "error" in answer else 200
            answer.pop("_status", None)
            return json_response(answer, status)

        async def events() -> AsyncIterator[bytes]:
            item: dict[str, Any] | None = first
            try:
                while item is not None:
                    yield encode_event(jsonrpc.dumps(item), event="message")
                    item = await queue.get()
                if final:
                    final[0].pop("_status", None)
                    yield encode_event(jsonrpc.dumps(final[0]), event="message")
            finally:
                # Legacy: a dropped connection is not a cancellation (the client cancels explicitly), so the
                # call runs to completion and is audited. Modern: closing the stream IS the cancellation.
                if scope.era == "modern" and not task.done():
                    task.cancel()

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def _batch(self, request: Request, principal: Principal, body: list[Any],
                     doc: strictjson.Document) -> Response:
        # Batches existed only in 2025-03-26; later revisions (2025-06-18, 2025-11-25, 2026-07-28, which has no
        # sessions at all) send one message per POST.
        if request.headers.get("mcp-session-id") is None:
            raise HttpError(400, "Bad Request: JSON-RPC batches are only allowed in 2025-03-26 sessions",
                            code=INVALID_REQUEST)
        session = await self._session(request, principal, required=True)
        assert session is not None
        if session.protocol_version != "2025-03-26":
            raise HttpError(400, "Bad Request: JSON-RPC batches are only allowed in 2025-03-26 sessions",
                            code=INVALID_REQUEST)
        if not body:
            raise HttpError(400, "Bad Request: empty batch", code=INVALID_REQUEST)
        live = self.gw.live.get(session.id)
        scope = d.Scope(principal=principal, era="legacy", protocol_version=session.protocol_version,
                        client_capabilities=session.client_capabilities, client_info=session.client_info,
                        emitter=NullEmitter(), session=session, live=live, log_level=session.log_level,
                        traceparent=request.headers.get("traceparent"), tracestate=request.headers.get("tracestate"))
        answers: list[Any] = []
        for item in body:
            try:
                msg = jsonrpc.classify(item, doc.flaw(item))
            except MessageRejected as exc:
                await self._audit_rejected_call(principal, item, exc, cut=doc.cut)
                answers.append(jsonrpc.error(exc.request_id, exc))
                continue
            if msg.kind == "request" and msg.method == "initialize":
                answers.append(jsonrpc.error(msg.id, ProtocolError(INVALID_REQUEST, "initialize cannot be batched")))
            elif msg.kind == "request":
                answer = await self._run(scope, msg, live)
                answer.pop("_status", None)
                answers.append(answer)
            else:
                await self._legacy(request, principal, session, msg, sse_ok=False)
        if not answers:
            return Response(status_code=202)
        return json_response(answers)

    # -- modern (2026-07-28) --------------------------------------------------------------------------------

    async def _modern(self, request: Request, principal: Principal, msg: jsonrpc.Message, meta: dict[str, Any],
                      sse_ok: bool) -> Response:
        # Order as in the reference SDK, so a client sees the same error for the same defect: the envelope,
        # then the headers mirroring the body, then the version. Mcp-Session-Id and Last-Event-ID mean nothing
        # here and are ignored; no session id is ever minted or echoed.
        version = meta.get(d.META_VERSION)
        caps = meta.get(d.META_CAPS)
        if not isinstance(caps, dict):
            err = ProtocolError(INVALID_PARAMS, f"Missing required _meta field {d.META_CAPS}", http_status=400)
            return json_response(jsonrpc.error(msg.id, err), 400)
        if msg.kind == "request":
            try:
                check_request_headers(((k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw),
                                      version, msg.method, msg.params, self._input_schema(principal, msg))
            except ProtocolError as exc:
                log.info("request.header_mismatch", method=msg.method[:100], reason=exc.message)
                return json_response(jsonrpc.error(msg.id, exc), exc.http_status)
        if version not in d.MODERN_VERSIONS:
            supported = [*d.MODERN_VERSIONS, *reversed(d.LEGACY_VERSIONS)]
            err = ProtocolError(UNSUPPORTED_PROTOCOL_VERSION, f"Unsupported protocol version: {version}",
                                data={"supported": supported, "requested": version}, http_status=400)
            return json_response(jsonrpc.error(msg.id, err), 400)
        if msg.kind != "request":
            return Response(status_code=202)
        info = jsonrpc.obj(meta.get(d.META_INFO)) or None
        level = meta.get(d.META_LOG_LEVEL)
        if level is not None and level not in d.LOG_LEVELS:
            err = ProtocolError(INVALID_PARAMS, "Invalid log level", http_status=400)
            return json_response(jsonrpc.error(msg.id, err), 400)
        scope = d.Scope(principal=principal, era="modern", protocol_version=str(version), client_capabilities=caps,
                        client_info=info, emitter=NullEmitter(), log_level=level if isinstance(level, str) else None,
                        traceparent=request.headers.get("traceparent"), tracestate=request.headers.get("tracestate"))
        if msg.method == "subscriptions/listen":
            try:
                return await self._listen(scope, msg, sse_ok)
            except ProtocolError as exc:
                return json_response(jsonrpc.error(msg.id, exc), exc.http_status)
        if not self.dispatcher.knows(msg.method, "modern"):
            err = ProtocolError(-32601, f"Method not found: {msg.method}", http_status=404)
            return json_response(jsonrpc.error(msg.id, err), 404)
        return await self._respond(scope, msg, None, sse_ok)

    def _input_schema(self, principal: Principal, msg: jsonrpc.Message) -> Any:
        """The called tool's schema as this caller sees it (for ``Mcp-Param-*``), or ``None``.

        A tool the caller may not see validates nothing here: the call itself reports it as unknown, so the
        header check cannot become an oracle for hidden tools.
        """
        name = msg.params.get("name")
        if msg.method != "tools/call" or not isinstance(name, str):
            return None
        view = self.gw.view
        entry = view.catalogue.tool(name)
        if entry is None or name in view.quarantined or not self.gw.access.tool_visible(principal, entry):
            return None
        return entry.definition.get("inputSchema")

    async def _listen(self, scope: d.Scope, msg: jsonrpc.Message, sse_ok: bool) -> Response:
        """``subscriptions/listen``: acknowledgement first, then only what the client opted into, each message
        tagged with the listen request's id, keep-alive comments in between, until the client goes away."""
        if not sse_ok:
            raise HttpError(406, "Not Acceptable: subscriptions/listen answers with text/event-stream")
        assert msg.id is not None
        wanted = ListenFilter.from_params(msg.params)
        resources = await self.dispatcher.listen_resources(scope, wanted.resources)
        stream = Stream(msg.id, scope.principal.id, ListenFilter(lists=wanted.lists, resources=resources))
        self.listeners.open(stream)
        ack = tagged(ACKNOWLEDGED, {"notifications": stream.filter.honoured()}, msg.id)
        log.info("listen.open", principal=scope.principal.id, lists=sorted(stream.filter.lists),
                 resources=len(resources))

        async def events() -> AsyncIterator[bytes]:
            try:
                yield encode_event(jsonrpc.dumps(ack), event="message")
                while True:
                    try:
                        item = await asyncio.wait_for(stream.queue.get(), KEEPALIVE_S)
                    except TimeoutError:
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

    # -- GET and DELETE -------------------------------------------------------------------------------------

    async def _get(self, request: Request, principal: Principal) -> Response:
        if request.headers.get("mcp-session-id") is None:
            # No legacy session: the 2026-07-28 revision has no GET stream.
            raise HttpError(405, "Method Not Allowed: GET needs a legacy session", headers={"Allow": "POST"})
        session = await self._session(request, principal, required=True)
        assert session is not None
        _, sse_ok = accepts(request.headers.get("accept"))
        if not sse_ok:
            raise HttpError(406, "Not Acceptable: GET requires Accept: text/event-stream")
        live = self.gw.live.get(session.id)
        if live.get_stream is not None:
            raise HttpError(409, "Conflict: this session already has a GET stream")
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        live.get_stream = queue
        live.principal, live.log_level = principal, session.log_level  # for upstream log relay

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b": bastion stream open\n\n"
                while True:
                    try:
                        item = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    if not item:  # the session ended
                        return
                    yield encode_event(jsonrpc.dumps(item), event="message")
            finally:
                if live.get_stream is queue:
                    live.get_stream = None

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def _delete(self, request: Request, principal: Principal) -> Response:
        if request.headers.get("mcp-session-id") is None:
            raise HttpError(405, "Method Not Allowed: DELETE needs a legacy session", headers={"Allow": "POST"})
        session = await self._session(request, principal, required=True)
        assert session is not None
        await self.gw.store.delete(session.id)
        self.gw.live.drop(session.id)
        if self.on_session is not None:
            await self.on_session("session.end", session, principal)
        log.info("session.end", session=session.id[:8], principal=principal.id)
        return Response(status_code=200)

    async def _announce(self, changed: list[str]) -> None:
        """Relay list changes to every legacy session listening on a GET stream of this replica, and to the
        modern listen streams that opted into them."""
        self.listeners.lists_changed(changed)
        for live in self.gw.live.all():
            if live.get_stream is None:
                continue
            for kind in changed:
                with contextlib.suppress(asyncio.QueueFull):
                    live.get_stream.put_nowait(jsonrpc.notification(f"notifications/{kind}/list_changed"))
