"""Answering one dispatched request: run it, shape the result for the caller's era, and choose JSON or SSE.

Both eras end here once the front door has a ``Scope`` (``server/lifecycle.py`` for a session, ``server/modern.py``
for a 2026-07-28 request). Running a request never raises: every failure becomes a JSON-RPC error with the
request's id, in an ``Answer`` that carries the HTTP status the caller's era gives it. Choosing the response's
form is separate from running it, because only ``tools/call`` can make an upstream talk back mid-request and so
needs a stream; see ``Responder.respond``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import structlog
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from bastion import jsonrpc
from bastion.errors import INTERNAL_ERROR, INVALID_REQUEST, MessageRejected, ProtocolError, RequestError
from bastion.gateway import Gateway
from bastion.principal import Principal
from bastion.protocol.meta import PROTOCOL_VERSION_KEY
from bastion.protocol.methods import TOOLS_CALL
from bastion.server.answer import MODERN_ERROR_STATUS, SSE_HEADERS, Answer
from bastion.server.dispatch import SERVER_INFO, Dispatcher
from bastion.server.emitter import Emitter, NullEmitter, Outbox, StreamEmitter
from bastion.server.eras import for_handshake_era, for_modern
from bastion.server.protocol import deliver, on_lost
from bastion.server.request_audit import AUDITED, refused_record
from bastion.server.scope import Scope
from bastion.sessions.live import InflightCall, LiveSession
from bastion.sse import encode_event

__all__ = ["CallResponse", "Responder"]

log = structlog.get_logger("bastion.http")

_MESSAGE_EVENT = b"event: message\ndata: "


def message_event(data: bytes) -> bytes:
    """``encode_event(data, event="message")``, the same bytes, in one copy when ``data`` is a single line.

    orjson writes no line break outside strings (where it escapes them), so a JSON-RPC message is one line unless
    an embedded ``orjson.Fragment`` carries one. The general encoder normalises line breaks and splits and joins
    the whole body: four passes and as many copies, about 0.7 ms for one 650 KB ``tools/list`` page. Two memchr
    scans prove there is nothing to split.
    """
    if b"\n" in data or b"\r" in data:
        return encode_event(data, event="message")
    return b"".join((_MESSAGE_EVENT, data, b"\n\n"))


class Responder:
    def __init__(self, gateway: Gateway, dispatcher: Dispatcher, ids: itertools.count[int]) -> None:
        self.gw = gateway
        self.dispatcher = dispatcher
        # Ids of bastion's own requests to clients (sampling, elicitation), unique on this replica.
        self._ids = ids
        self._loop: asyncio.AbstractEventLoop | None = None
        # Messages a call's response stream holds for a client that does not read it (``listen.client_backlog``).
        self._backlog = gateway.settings.listen.client_backlog

    def task(self) -> asyncio.Task[Any]:
        """The current task. ``asyncio.current_task()`` looks the running loop up, a ``getpid`` system call on
        Python 3.11; with the loop known, it is a dictionary lookup (as in ``bastion/deadlines.py``)."""
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None:
            # First use, or a different loop: ``current_task(loop)`` finds no task running on the old one.
            self._loop = loop = asyncio.get_running_loop()
            task = asyncio.current_task(loop)
            if task is None:
                raise RuntimeError("a request must run in a task")
        return task

    async def run(self, scope: Scope, msg: jsonrpc.Message, live: LiveSession | None,
                  call: InflightCall | None = None, receive: Receive | None = None) -> Answer:
        """Dispatch one request to a JSON-RPC response, in the current task; registered with the session for
        cancellation while it runs (``call``, when the caller holds the handle itself).

        ``receive`` is a 2026-07-28 request's own: in that revision the client closing the connection before the
        answer leaves cancels the request, as closing its stream does. Under bastion's HTTP protocol the
        connection's loss cancels ``call`` directly (``protocol.on_lost``), armed only while the request runs
        here, so the cancellation always lands in the ``try`` below; under another server a plain JSON answer
        runs to completion (nothing watches the connection meanwhile)."""
        watched: Receive | None = None
        if live is not None and msg.id is not None:
            if msg.id in live.inflight:
                # Registering it would take the first request's place: a cancellation would then reach the wrong
                # one, and the first would be left uncancellable once this one ended.
                return await self._duplicate(scope, msg)
            if call is None:
                call = InflightCall(self.task())
            live.inflight[msg.id] = call
        elif receive is not None:
            if call is None:
                call = InflightCall(self.task())
            if on_lost(receive, call.cancel):
                watched = receive
        try:
            result = await self.dispatcher.handle(scope, msg)
            shaped = for_modern(result, SERVER_INFO) if scope.era == "modern" else for_handshake_era(result)
            return Answer(jsonrpc.result(msg.id, shaped))
        except ProtocolError as exc:
            if exc.log_detail:
                log.info("request.failed", method=msg.method, code=exc.code, detail=exc.log_detail)
            if scope.era != "modern":
                return Answer.error(msg.id, exc, 200)  # the session-based revisions carry every error in a 200
            status = exc.http_status if exc.http_status != 200 else MODERN_ERROR_STATUS.get(exc.code, 200)
            return Answer.error(msg.id, exc, status)
        except RequestError as exc:
            # Tool-plane errors become results inside the pipeline; an HttpError here is a bug in routing.
            log.error("request.unexpected_plane", method=msg.method, error=exc.message)
            return Answer(jsonrpc.error(msg.id, ProtocolError(-32603, "Internal error")))
        except asyncio.CancelledError:
            current = asyncio.current_task()
            cancelling = current.cancelling() if current is not None else 0
            if cancelling:
                # The client's own cancellation is answered; any other (a shutdown) goes on up.
                if call is None or not call.by_client or cancelling > 1:
                    raise
                current.uncancel()  # type: ignore[union-attr]  # cancelling() > 0: there is a current task
            return Answer(jsonrpc.error(msg.id, ProtocolError(-32603, "Request cancelled")))
        except Exception:
            # A bug outside the pipeline (which records and answers its own failures): say "internal error" with
            # the request's id, not "cancelled", and leave the traceback in the log.
            log.error("request.crashed", method=msg.method[:100], exc_info=True)
            return Answer(jsonrpc.error(msg.id, ProtocolError(-32603, "Internal error")))
        finally:
            if live is not None and msg.id is not None:
                live.inflight.pop(msg.id, None)
            elif watched is not None:
                on_lost(watched, None)

    async def _duplicate(self, scope: Scope, msg: jsonrpc.Message) -> Answer:
        """A session's request whose id another of its requests in flight already has (the session-based revisions
        forbid reusing an id within a session). It is refused on its own; the first runs on untouched. A refused
        ``tools/call`` is still a call, and gets its one audit record."""
        error: ProtocolError = ProtocolError(
            INVALID_REQUEST, f"Invalid Request: id {jsonrpc.dumps(msg.id).decode()} is already in use by a request "
                             "in flight in this session", log_detail="duplicate request id")
        log.info("request.duplicate_id", method=msg.method[:100], session=scope.session.id[:8] if scope.session
                 else None, principal=scope.principal.id)
        if msg.method == TOOLS_CALL:
            name = msg.params.get("name")
            try:
                await self.gw.audit_refused_call(
                    scope.principal, name if isinstance(name, str) else "", msg.params.get("arguments"),
                    era=scope.era, session_id=scope.session.id if scope.session else None,
                    client_info=scope.client_info, request_id=msg.id, stage="parse", outcome="invalid_input",
                    reason=error.message, error=error, traceparent=scope.traceparent)
            except ProtocolError as failed:  # the record could not be written under ``audit.required``
                error = failed
        elif msg.method in AUDITED:
            try:
                await self.gw.emit_audit(refused_record(scope.principal, msg.method, msg.params, msg.id, error, scope,
                                                        self.gw.redact_text))
            except ProtocolError as failed:
                error = failed
        return Answer.error(msg.id, error, 200)

    def emitter(self, era: str, msg: jsonrpc.Message, live: LiveSession | None, sse_ok: bool) -> Emitter:
        """The channel ``respond`` will give this request: a stream for a ``tools/call`` whose client accepts
        SSE, else none. A front door that builds its ``Scope`` with it spares ``respond`` a copy of the scope."""
        if sse_ok and msg.method == TOOLS_CALL:
            return StreamEmitter(Outbox(self.gw.relay_dropped, bound=self._backlog), live if era == "legacy" else None,
                                 self._ids)
        return NullEmitter()

    async def respond(self, scope: Scope, msg: jsonrpc.Message, live: LiveSession | None,
                      sse_ok: bool, receive: Receive | None = None) -> Response:
        """Answer with JSON unless something must reach the client before the answer.

        Only ``tools/call`` can make an upstream talk back mid-request (progress, log messages, sampling and
        elicitation requests). For it, the choice is made lazily (``CallResponse``): the response becomes an SSE
        stream only if a message for the client comes before the result. A plain call answers with plain JSON,
        and a call that needs the stream gets it without the client having to guess.

        ``receive``: a 2026-07-28 request's, which losing its connection cancels (``run``).
        """
        if not sse_ok:
            return (await self.run(scope, msg, live, None, receive)).response()
        if msg.method != TOOLS_CALL:
            if scope.era == "modern":
                return (await self.run(scope, msg, live, None, receive)).response()
            # Legacy clients that accept SSE get it, as the SDK's own servers do (the conformance harness checks
            # that concurrent POST streams work); a one-event stream costs next to nothing off the call path.
            answer = await self.run(scope, msg, live)
            return Response(message_event(jsonrpc.dumps(answer.body)), media_type="text/event-stream",
                            headers=SSE_HEADERS)
        emitter = scope.emitter
        if not isinstance(emitter, StreamEmitter):
            emitter = StreamEmitter(Outbox(self.gw.relay_dropped, bound=self._backlog),
                                    live if scope.era == "legacy" else None, self._ids)
            scope = scope._replace(emitter=emitter)
        return CallResponse(self, scope, msg, live, emitter.outbox)

    async def audit_refused(self, principal: Principal, msg: jsonrpc.Message, exc: RequestError) -> None:
        """A tools/call the front door refused after reading it and before the dispatcher saw it (the envelope or
        headers its revision refuses, a missing, unknown or foreign session) is still a call: it gets its one
        audit record, at stage ``parse``. Every answer from the dispatcher on is recorded there instead. Its era
        is read from the body, its session is not recorded (not verified). Another forwarded request gets its
        ``request`` record the same way."""
        if msg.kind == "request" and msg.method in AUDITED:
            await self.gw.emit_audit(refused_record(principal, msg.method, msg.params, msg.id, exc,
                                                    redact=self.gw.redact_text))
            return
        if msg.kind != "request" or msg.method != TOOLS_CALL:
            return
        name = msg.params.get("name")
        meta = jsonrpc.obj(msg.params.get("_meta"))
        await self.gw.audit_refused_call(
            principal, name if isinstance(name, str) else "", msg.params.get("arguments"),
            era="modern" if PROTOCOL_VERSION_KEY in meta else "legacy", session_id=None, client_info=None,
            request_id=msg.id, stage="parse", outcome="invalid_input", reason=exc.message, error=exc)

    async def audit_rejected(self, principal: Principal, body: Any, exc: MessageRejected, *,
                             cut: bool = False) -> None:
        """A tools/call the parser refused (arguments too deep, unrepresentable values) is still a call: it gets
        its one audit record. Its era is read from the body; its session is not recorded (not yet verified).
        Another forwarded request gets its ``request`` record the same way."""
        if not isinstance(body, dict) or "id" not in body:
            return
        params = jsonrpc.obj(body.get("params"))
        if body.get("method") in AUDITED:
            await self.gw.emit_audit(refused_record(principal, body["method"], params, exc.request_id, exc,
                                                    redact=self.gw.redact_text))
            return
        if body.get("method") != TOOLS_CALL:
            return
        meta = jsonrpc.obj(params.get("_meta"))
        name = params.get("name")
        await self.gw.audit_refused_call(
            principal, name if isinstance(name, str) else "", params.get("arguments"),
            era="modern" if PROTOCOL_VERSION_KEY in meta else "legacy", session_id=None, client_info=None,
            request_id=exc.request_id, stage="parse", outcome="invalid_input", reason=exc.message, error=exc,
            audit_error="arguments: nested past what the parser reads; the digest is of the arguments cut at the "
                        "depth limit" if cut else None)


class CallResponse(Response):
    """A ``tools/call``'s answer to a client that accepts SSE: plain JSON, or an SSE stream if a message for the
    client comes before the result.

    The call runs in the request's own task, inside ``__call__``: most calls send nothing before their result,
    and a task of their own cost every call a task, a future and one more turn of the event loop. The first message
    for the client (``Outbox.on_first``) starts a second task that writes the stream, with the message and
    everything after it, the result last. The call's task is not the stream's, so the stream cannot simply be
    returned: it is awaited once the result is in it.

    Cancellation is unchanged: ``notifications/cancelled`` (and a session's ``DELETE``) cancel the call through
    its ``InflightCall``; in the 2026-07-28 revision so does the client closing the connection, whether the
    stream has started (the stream's writer notices) or not (the HTTP protocol tells ``run``, see there), while
    in the session-based revisions a dropped connection is not a cancellation, so the call runs to completion and
    is audited. A cancelled call's stream ends without a result, as the revisions ask. What such a call still
    relays after its stream is gone is discarded (``Outbox.close``): its progress and log messages are not queued,
    its requests to the client are refused, and those waiting fail, as they do when the call ends.

    ``Response`` only in type: nothing of it is used but ``__call__``, which the front door calls.
    """

    def __init__(self, responder: Responder, scope: Scope, msg: jsonrpc.Message, live: LiveSession | None,
                 outbox: Outbox) -> None:
        # Response.__init__ is not called: this answer has no body of its own to render.
        self._responder = responder
        self._scope = scope
        self._msg = msg
        self._live = live
        self._outbox = outbox
        self._stream: asyncio.Task[None] | None = None
        self._call: InflightCall | None = None
        self._done = False

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        call = self._call = InflightCall(self._responder.task())
        outbox = self._outbox
        outbox.on_first = lambda: self._open_stream(scope, receive, send)
        answer: Answer | None = None
        try:
            answer = await self._responder.run(self._scope, self._msg, self._live, call,
                                               receive if self._scope.era == "modern" else None)
        finally:
            self._done = True
            outbox.on_first = None
            if self._stream is not None:
                # bastion's requests to the client end with the call, not at their own timeout.
                outbox.fail_asks(ProtocolError(INTERNAL_ERROR, "the call this request belongs to has ended"))
                if answer is not None and not call.by_client and isinstance(answer.body, dict):
                    outbox.put_nowait(answer.body)
                outbox.put_nowait(None)
        if self._stream is not None:
            await self._stream
        elif answer is not None:
            await deliver(answer.response(), scope, receive, send)

    def _open_stream(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        self._stream = asyncio.create_task(self._write_stream(scope, receive, send),
                                           name=f"bastion-stream-{self._msg.id}")

    async def _write_stream(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        outbox = self._outbox

        async def events() -> AsyncIterator[bytes]:
            try:
                item = await outbox.get()
                while item is not None:
                    yield message_event(jsonrpc.dumps(item))
                    item = await outbox.get()
            finally:
                # Modern: closing the stream IS the cancellation. Legacy: the call runs on (see the class).
                if self._scope.era == "modern" and not self._done and self._call is not None:
                    self._call.cancel()

        try:
            await StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)(scope, receive,
                                                                                                   send)
        finally:
            # The writer is done, or gone with its client: a handshake-era call runs on, and what it still relays
            # must not wait in a queue nobody drains (``bastion.backlog``).
            outbox.close(ProtocolError(INTERNAL_ERROR, "the client's stream is gone"))
