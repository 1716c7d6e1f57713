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
from dataclasses import replace
from typing import Any

import structlog
from starlette.responses import Response, StreamingResponse

from bastion import jsonrpc
from bastion.errors import MessageRejected, ProtocolError, RequestError
from bastion.gateway import Gateway
from bastion.principal import Principal
from bastion.protocol.meta import PROTOCOL_VERSION_KEY
from bastion.protocol.methods import TOOLS_CALL
from bastion.server.answer import MODERN_ERROR_STATUS, SSE_HEADERS, Answer, json_response
from bastion.server.dispatch import SERVER_INFO, Dispatcher
from bastion.server.emitter import Emitter, NullEmitter, Outbox, StreamEmitter
from bastion.server.eras import for_handshake_era, for_modern
from bastion.server.scope import Scope
from bastion.sessions.live import LiveSession
from bastion.sse import encode_event

__all__ = ["Responder"]

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

    async def run(self, scope: Scope, msg: jsonrpc.Message, live: LiveSession | None) -> Answer:
        """Dispatch one request to a JSON-RPC response; registered for cancellation while it runs."""
        task = asyncio.current_task()
        if live is not None and task is not None and msg.id is not None:
            live.inflight[msg.id] = task
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
            if current is not None and current.cancelling():
                raise
            return Answer(jsonrpc.error(msg.id, ProtocolError(-32603, "Request cancelled")))
        except Exception:
            # A bug outside the pipeline (which records and answers its own failures): say "internal error" with
            # the request's id, not "cancelled", and leave the traceback in the log.
            log.error("request.crashed", method=msg.method[:100], exc_info=True)
            return Answer(jsonrpc.error(msg.id, ProtocolError(-32603, "Internal error")))
        finally:
            if live is not None and msg.id is not None:
                live.inflight.pop(msg.id, None)

    def emitter(self, era: str, msg: jsonrpc.Message, live: LiveSession | None, sse_ok: bool) -> Emitter:
        """The channel ``respond`` will give this request: a stream for a ``tools/call`` whose client accepts
        SSE, else none. A front door that builds its ``Scope`` with it spares ``respond`` a copy of the scope."""
        if sse_ok and msg.method == TOOLS_CALL:
            return StreamEmitter(Outbox(), live if era == "legacy" else None, self._ids)
        return NullEmitter()

    async def respond(self, scope: Scope, msg: jsonrpc.Message, live: LiveSession | None,
                      sse_ok: bool) -> Response:
        """Answer with JSON unless something must reach the client before the answer.

        Only ``tools/call`` can make an upstream talk back mid-request (progress, log messages, sampling and
        elicitation requests). For it, the choice is made lazily: the call runs in a task, and the response
        becomes an SSE stream only if a message for the client comes before the result. A plain call answers with
        plain JSON, and a call that needs the stream gets it without the client having to guess.
        """
        if not sse_ok:
            return (await self.run(scope, msg, live)).response()
        if msg.method != TOOLS_CALL:
            if scope.era == "modern":
                return (await self.run(scope, msg, live)).response()
            # Legacy clients that accept SSE get it, as the SDK's own servers do (the conformance harness checks
            # that concurrent POST streams work); a one-event stream costs next to nothing off the call path.
            answer = await self.run(scope, msg, live)
            return Response(message_event(jsonrpc.dumps(answer.body)), media_type="text/event-stream",
                            headers=SSE_HEADERS)
        emitter = scope.emitter
        if not isinstance(emitter, StreamEmitter):
            emitter = StreamEmitter(Outbox(), live if scope.era == "legacy" else None, self._ids)
            scope = replace(scope, emitter=emitter)
        queue = emitter.outbox
        final: list[Answer] = []

        async def work() -> None:
            try:
                final.append(await self.run(scope, msg, live))
            finally:
                queue.put_nowait(None)

        task = asyncio.create_task(work(), name=f"bastion-call-{msg.id}")
        if live is not None and msg.id is not None:
            live.inflight[msg.id] = task
        first = await queue.get()
        if first is None:
            if not final:  # the task was cancelled (client sent notifications/cancelled)
                return json_response(jsonrpc.error(msg.id, ProtocolError(-32603, "Request cancelled")))
            return final[0].response()

        async def events() -> AsyncIterator[bytes]:
            item: dict[str, Any] | None = first
            try:
                while item is not None:
                    yield message_event(jsonrpc.dumps(item))
                    item = await queue.get()
                if final:
                    yield message_event(jsonrpc.dumps(final[0].body))
            finally:
                # Legacy: a dropped connection is not a cancellation (the client cancels explicitly), so the
                # call runs to completion and is audited. Modern: closing the stream IS the cancellation.
                if scope.era == "modern" and not task.done():
                    task.cancel()

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def audit_rejected(self, principal: Principal, body: Any, exc: MessageRejected, *,
                             cut: bool = False) -> None:
        """A tools/call the parser refused (arguments too deep, unrepresentable values) is still a call: it gets
        its one audit record. Its era is read from the body; its session is not recorded (not yet verified)."""
        if not isinstance(body, dict) or body.get("method") != TOOLS_CALL or "id" not in body:
            return
        params = jsonrpc.obj(body.get("params"))
        meta = jsonrpc.obj(params.get("_meta"))
        name = params.get("name")
        await self.gw.audit_refused_call(
            principal, name if isinstance(name, str) else "", params.get("arguments"),
            era="modern" if PROTOCOL_VERSION_KEY in meta else "legacy", session_id=None, client_info=None,
            request_id=exc.request_id, stage="parse", outcome="invalid_input", reason=exc.message, error=exc,
            audit_error="arguments: nested past what the parser reads; the digest is of the arguments cut at the "
                        "depth limit" if cut else None)
