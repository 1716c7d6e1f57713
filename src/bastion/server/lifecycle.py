"""The session-based revisions (2024-11-05 … 2025-11-25) at the front door: a session's life, from
``initialize`` to ``DELETE``.

- ``initialize`` opens a session (``Mcp-Session-Id``), in the store every replica shares;
- every later request names it, and is served only to the principal that opened it: an unknown id and another
  principal's id get the same 404, so session ids cannot be probed;
- notifications and responses within a session are accepted with 202 (``initialized``, cancellations, and the
  client's answers to bastion's own sampling and elicitation requests);
- ``GET`` opens the session's stream of unsolicited messages (list changes, upstream logs), one per session on
  the replica that holds it; ``DELETE`` ends the session;
- JSON-RPC batches, which only 2025-03-26 sessions may send.

A session is never a credential: the request was authenticated before it gets here. The 2026-07-28 revision has
none of this (``server/modern.py``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, cast

import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from bastion import jsonrpc, strictjson
from bastion.backlog import Outbox
from bastion.delivery import ListChange
from bastion.errors import INVALID_REQUEST, HttpError, MessageRejected, ProtocolError
from bastion.gateway import Gateway
from bastion.principal import Principal
from bastion.protocol.capabilities import checked_capabilities
from bastion.protocol.messages import InitializeParams
from bastion.protocol.methods import CANCELLED, INITIALIZE, INITIALIZED, list_changed
from bastion.protocol.versions import BATCH_VERSION, HANDSHAKE_VERSIONS
from bastion.server.answer import KEEPALIVE_S, SSE_HEADERS, Answer
from bastion.server.dispatch import Dispatcher, negotiate
from bastion.server.emitter import Emitter, NullEmitter
from bastion.server.responder import Responder
from bastion.server.scope import Scope
from bastion.server.standing import Standing, StandingOf, Verdict
from bastion.server.stream_clock import Idle, next_message
from bastion.sessions.live import LiveSession
from bastion.sessions.store import SessionData, new_session_id
from bastion.sse import encode_event

__all__ = ["SessionEvent", "SessionLifecycle"]

log = structlog.get_logger("bastion.http")

# ("session.start" | "session.end", session, principal, why it ended): the audit record of a session's start and
# end.
SessionEvent = Callable[[str, SessionData, Principal, str | None], Awaitable[None]]


def stream_tick(idle_timeout_s: float) -> float:
    """How often an idle GET stream sends a keep-alive and re-checks its session: every ``KEEPALIVE_S``, or half
    the idle timeout when that is shorter (a session's expiry found by another replica is then noticed here within
    half its idle time)."""
    return max(0.05, min(KEEPALIVE_S, idle_timeout_s / 2))


class SessionLifecycle:
    def __init__(self, gateway: Gateway, dispatcher: Dispatcher, responder: Responder,
                 on_session: SessionEvent | None, standing: StandingOf) -> None:
        self.gw = gateway
        self.standing = standing
        self.dispatcher = dispatcher
        self.responder = responder
        self.on_session = on_session

    async def find(self, request: Request, principal: Principal) -> SessionData:
        """The session a request names, if this principal opened it; else 400 (none named) or 404."""
        sid = request.headers.get("mcp-session-id")
        if sid is None:
            raise HttpError(400, "Bad Request: Mcp-Session-Id header is required")
        data = await self.gw.store.get(sid)
        # Another principal's session id is answered like an unknown one, so session ids cannot be probed.
        if data is None or data.principal_id != principal.id:
            raise HttpError(404, "Session not found", code=INVALID_REQUEST)
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_VERSIONS:
            raise HttpError(400, f"Bad Request: unsupported MCP-Protocol-Version {version[:40]!r}",
                            data={"supported": list(HANDSHAKE_VERSIONS)})
        return data

    def _scope(self, request: Request, principal: Principal, session: SessionData, live: LiveSession,
               emitter: Emitter | None = None) -> Scope:
        return Scope(principal=principal, era="legacy", protocol_version=session.protocol_version,
                     client_capabilities=session.client_capabilities, client_info=session.client_info,
                     emitter=emitter or NullEmitter(), session=session, live=live, log_level=session.log_level,
                     traceparent=request.headers.get("traceparent"), tracestate=request.headers.get("tracestate"))

    # -- POST -----------------------------------------------------------------------------------------------

    async def initialize(self, principal: Principal, msg: jsonrpc.Message) -> Answer:
        params = cast(InitializeParams, msg.params)
        version = negotiate(params.get("protocolVersion"))
        try:
            # Absent capabilities are no capabilities (clients older than the schema's requirement omit them);
            # present ones are what every later request of the session is judged and forwarded by.
            caps = checked_capabilities(params.get("capabilities", {}), "capabilities")
        except ProtocolError as exc:
            return Answer.error(msg.id, exc)
        info = jsonrpc.obj(params.get("clientInfo"))
        data = SessionData(id=new_session_id(), principal_id=principal.id, protocol_version=version,
                           client_capabilities=caps,
                           client_info={k: info[k] for k in ("name", "version", "title")
                                        if isinstance(info.get(k), str)},
                           created_at=time.time())
        # Created first, so a session that the store refuses (full, unavailable) never gets a start record; then
        # recorded, and an initialize refused there (``audit.required`` with a failing sink) takes its session
        # away again: the client never learns its id, so nothing must remain that holds a place for it.
        await self.gw.store.create(data)
        if self.on_session is not None:
            try:
                await self.on_session("session.start", data, principal, None)
            except BaseException:
                await self._discard(data)
                raise
        log.info("session.start", session=data.id[:8], principal=principal.id, version=version,
                 client=data.client_info.get("name"))
        return Answer(jsonrpc.result(msg.id, self.dispatcher.initialize_result(version)),
                      headers={"Mcp-Session-Id": data.id})

    async def _discard(self, data: SessionData) -> None:
        """Remove a session whose ``initialize`` was refused after the store created it. Should the store fail
        this too, the session is only logged: nobody knows its id, and it ends at its idle timeout."""
        try:
            await self.gw.store.delete(data.id)
        except Exception as exc:
            log.warning("session.discard_failed", session=data.id[:8], error=type(exc).__name__)
        self.gw.live.drop(data.id)

    async def serve(self, request: Request, principal: Principal, msg: jsonrpc.Message, sse_ok: bool) -> Response:
        """One message within the session the request names."""
        try:
            session = await self.find(request, principal)
        except HttpError as exc:
            await self.responder.audit_refused(principal, msg, exc)
            raise
        live = self.gw.live.get(session.id)
        if msg.kind != "request":
            return (await self._accept(session, live, msg)).response()
        emitter = self.responder.emitter("legacy", msg, live, sse_ok)
        return await self.responder.respond(self._scope(request, principal, session, live, emitter), msg, live,
                                            sse_ok)

    async def _accept(self, session: SessionData, live: LiveSession, msg: jsonrpc.Message) -> Answer:
        """A notification, or the client's answer to one of bastion's own requests: 202 either way."""
        if msg.kind == "notification":
            if msg.method == INITIALIZED and not session.initialized:
                await self.gw.store.update(replace(session, initialized=True))
            elif msg.method == CANCELLED:
                # Only an id bastion could have registered can name a request (``jsonrpc.as_request_id``).
                rid = jsonrpc.as_request_id(msg.params.get("requestId"))
                call = live.inflight.get(rid) if rid is not None else None
                if call is not None:
                    call.cancel()
        else:
            fut = live.pending.get(msg.id) if msg.id is not None else None
            if fut is not None and not fut.done():
                fut.set_result(msg.raw)
        return Answer.empty(202)

    async def batch(self, request: Request, principal: Principal, body: list[Any],
                    doc: strictjson.Document) -> Answer:
        # Batches existed only in 2025-03-26; later revisions (2025-06-18, 2025-11-25, 2026-07-28, which has no
        # sessions at all) send one message per POST.
        try:
            session = await self._batch_session(request, principal, body)
        except HttpError as exc:
            # Refused whole: each tools/call in it still gets its one record.
            for item in body:
                try:
                    msg = jsonrpc.classify(item, doc.flaw(item))
                except MessageRejected as rejected:
                    await self.responder.audit_rejected(principal, item, rejected, cut=doc.cut)
                    continue
                await self.responder.audit_refused(principal, msg, exc)
            raise
        live = self.gw.live.get(session.id)
        scope = self._scope(request, principal, session, live)
        answers: list[Any] = []
        for item in body:
            # Each item is a request of its own: an error it raises (its audit record failing under
            # ``audit.required`` included) answers that item, with its id, and the batch goes on.
            try:
                msg = jsonrpc.classify(item, doc.flaw(item))
            except MessageRejected as exc:
                error: ProtocolError = exc
                try:
                    await self.responder.audit_rejected(principal, item, exc, cut=doc.cut)
                except ProtocolError as failed:
                    error = failed
                answers.append(jsonrpc.error(exc.request_id, error))
                continue
            try:
                if msg.kind == "request" and msg.method == INITIALIZE:
                    answers.append(jsonrpc.error(msg.id, ProtocolError(INVALID_REQUEST,
                                                                       "initialize cannot be batched")))
                elif msg.kind == "request":
                    # Inside a batch only the message counts: an error's HTTP status has nowhere to go.
                    answers.append((await self.responder.run(scope, msg, live)).body)
                else:
                    await self._accept(session, live, msg)
            except ProtocolError as exc:
                if msg.kind == "request":
                    answers.append(jsonrpc.error(msg.id, exc))
        if not answers:
            return Answer.empty(202)
        return Answer(answers)

    async def _batch_session(self, request: Request, principal: Principal, body: list[Any]) -> SessionData:
        if request.headers.get("mcp-session-id") is None:
            raise HttpError(400, "Bad Request: JSON-RPC batches are only allowed in 2025-03-26 sessions",
                            code=INVALID_REQUEST)
        session = await self.find(request, principal)
        if session.protocol_version != BATCH_VERSION:
            raise HttpError(400, "Bad Request: JSON-RPC batches are only allowed in 2025-03-26 sessions",
                            code=INVALID_REQUEST)
        if not body:
            raise HttpError(400, "Bad Request: empty batch", code=INVALID_REQUEST)
        return session

    # -- GET and DELETE -------------------------------------------------------------------------------------

    async def stream(self, request: Request, principal: Principal, sse_ok: bool) -> Response:
        """The session's stream of unsolicited messages (``GET``), until the client goes or the session ends.

        A stream is authorised once, when it opens, and may stay open for hours, so it does not rely on that:
        every way its session ends ends it (``LiveSessions.end``: DELETE, expiry and eviction found on this
        replica), and at each keep-alive tick it re-checks its session in the store without refreshing it, so a
        session ended through another replica (with Redis) closes the stream within one tick. At each tick, and
        at a JWT's ``exp``, it also presents its credential again (``server/standing.py``): an expired one closes
        the stream (the client reconnects with a fresh one, in the same session); one that no longer
        authenticates at all (``revoked``) ends the session; one whose principal changed groups or attributes
        goes on as the principal it is now, which every later delivery is judged with.
        """
        session = await self.find(request, principal)
        if not sse_ok:
            raise HttpError(406, "Not Acceptable: GET requires Accept: text/event-stream")
        live = self.gw.live.get(session.id)
        if live.get_stream is not None:
            raise HttpError(409, "Conflict: this session already has a GET stream")
        # Bounded for every producer (resource updates, list changes, log messages): ``bastion.backlog``.
        queue = Outbox(self.gw.relay_dropped, bound=self.gw.settings.listen.client_backlog, queue="session")
        live.get_stream = queue
        live.principal, live.log_level = principal, session.log_level  # for upstream log relay
        tick = stream_tick(self.gw.settings.sessions.idle_timeout_s)
        standing = self.standing(principal, request, "legacy", session.id)

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b": bastion stream open\n\n"
                while True:
                    item = await next_message(queue.get, tick, standing.principal.expires_at, standing.recheck)
                    if item is Idle.TICK or item is Idle.EXPIRED:
                        # At each tick, and at the credential's expiry (after which nothing more is delivered).
                        if not await self._still_standing(session, live, standing):
                            return
                        yield b": keep-alive\n\n"
                        continue
                    if not item:  # the session ended
                        return
                    yield encode_event(jsonrpc.dumps(item), event="message")
            finally:
                if live.get_stream is queue:
                    live.get_stream = None
                queue.close(ConnectionError("the GET stream is gone"))

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def _still_standing(self, session: SessionData, live: LiveSession, standing: Standing) -> bool:
        """Whether the GET stream may go on: its credential still authenticates its principal, and its session is
        still open. Ends what may not (the stream; with a revoked credential, the session too)."""
        verdict = await standing.check()
        if verdict.ended == "credential_expired":
            log.info("session.stream_closed", session=session.id[:8], reason="credential_expired")
            return False
        if verdict.ended == "revoked":
            await self._revoke(session, verdict)
            return False
        live.principal = verdict.principal
        if not await self._still_open(session, verdict.principal):
            self.gw.live.end(session.id)
            log.info("session.stream_closed", session=session.id[:8], reason="session_ended")
            return False
        return True

    async def _revoke(self, session: SessionData, verdict: Verdict) -> None:
        """The credential that opened the stream no longer authenticates anyone (or now stands for someone else):
        the session ends, on every replica, with its ``session.end`` record (``revoked``). Calls already running
        finish on their own POST streams, each authorised when it started and bounded by its timeout."""
        log.warning("session.revoked", session=session.id[:8], principal=verdict.principal.id,
                    detail=verdict.detail)
        try:
            removed = await self.gw.store.delete(session.id)
        except HttpError:
            # The store is unreachable: the session ends here now, and at its idle timeout everywhere (with its
            # record then); the credential is refused on every request anyway.
            log.warning("session.revoke_unshared", session=session.id[:8])
            removed = False
        self.gw.live.end(session.id)
        # Only the replica that removed it records its end: one ended meanwhile (expired, deleted, evicted) has
        # its record already.
        if removed and self.on_session is not None:
            await self.on_session("session.end", session, verdict.principal, "revoked")

    async def _still_open(self, session: SessionData, principal: Principal) -> bool:
        """Whether the stream's session is still open, asked without counting as a use; an unavailable store
        keeps the stream (an outage ends no session: ``sessions.fallback``)."""
        try:
            data = await self.gw.store.peek(session.id)
        except HttpError:
            return True
        return data is not None and data.principal_id == principal.id

    async def close(self, request: Request, principal: Principal) -> Answer:
        """``DELETE``: the session ends, on every replica (the store) and on this one (its live state)."""
        session = await self.find(request, principal)
        await self.gw.store.delete(session.id)
        self.gw.live.drop(session.id)
        if self.on_session is not None:
            await self.on_session("session.end", session, principal, "deleted")
        log.info("session.end", session=session.id[:8], principal=principal.id)
        return Answer.empty(200)

    def lists_changed(self, changes: list[ListChange]) -> None:
        """Relay list changes to every session of this replica that has a GET stream open and whose principal
        may see an entry that changed (``bastion.delivery``)."""
        for live in self.gw.live.all():
            if live.get_stream is None:
                continue
            for change in changes:
                if not self.gw.delivery.allows(live.principal, change):
                    continue
                live.get_stream.offer(jsonrpc.notification(list_changed(change.kind)))
