"""What every transport shares: request ids, pending answers, progress-token mapping, and routing of what the
upstream sends back.

A transport owns only its framing. It hands ``RpcSession`` a ``send`` for whole messages (used for answers to
server requests and for cancellations), gives ``call`` a ``transmit`` that puts one request on the wire, and
feeds every message it reads to ``handle``. The session does the rest, identically for stdio, Streamable HTTP
and legacy HTTP+SSE.

Routing of upstream-initiated messages:
- a response resolves the pending request with its id, once, and only from the stream that request owns: where
  the transport knows the stream (``related``: a Streamable HTTP POST stream) a response carrying any other id is
  stray, and a stream that carries no responses (the HTTP GET stream: ``answers=False``) has only stray ones.
  Stray responses (unknown id, late, duplicate, wrong stream, malformed id) are dropped, logged with the
  upstream's name and reported to ``on_stray`` (the metric), so one caller never receives what was sent under
  another caller's id. Ids come from ``RequestIds``: never reused on a connection, and not guessable;
- ``notifications/progress`` goes to the request whose rewritten token it carries (on a request's own stream
  only), with the caller's token put back; other notifications go to the request whose stream carried them
  (``related``, Streamable HTTP) or, when no stream says so, to ``on_notification``. A log message on stdio,
  which has no per-request stream, goes to the call in flight when there is one; with several it goes to each
  of their callers once (``audience_of``: one client session), on its most recent call. A log message is the
  upstream's, and any caller of it may receive one outside a call too (``server.log_relay``), so this shows
  nobody more than that; a guess could hand the call that caused it nothing at all;
- a server request (``sampling/createMessage``, ``elicitation/create``, ``roots/list``) goes to ``related``
  when the transport knows it; otherwise (stdio, GET streams) to the only in-flight request that accepts
  messages. With several, bastion cannot tell whose it is: when all were made by one principal it goes to the
  most recently sent (a wrong guess stays within that principal's own calls), otherwise relaying it to the wrong
  client could hand that client another caller's data, and it is refused. ``roots/list`` with no call to relay
  it to is answered with an empty list (bastion shares no client's roots outside that client's own call);
  ``ping`` is answered here.

Server requests are bounded per connection: at most ``ServerRequests.max_serving`` (the upstream's
``max_server_requests``, default ``MAX_SERVING``) are served or relayed at once, each in a task of its own; one more
(or one reusing the id of a request still served) is refused at once with a JSON-RPC error, written before the next
message is read, so an upstream that sends requests faster than it takes their answers slows only its own
reading. Every refusal is reported to ``ServerRequests.on_refused`` (the metric, with a reason from the closed set
``REFUSAL_REASONS``). The warnings one message can cause (a refused or malformed request, an answer that could not
be delivered) are rate-limited per connection (``noisy``): a hostile upstream cannot flood the log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import structlog

from bastion.bucket import TokenBucket
from bastion.deadlines import Deadlines
from bastion.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RATE_LIMITED,
    ProtocolError,
    UpstreamRpcError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.holdover import Abandoned, current_hold
from bastion.jsonrpc import read_error
from bastion.protocol.meta import SUBSCRIPTION_ID_KEY as SUBSCRIPTION_ID
from bastion.protocol.methods import CANCELLED, LISTEN, LOG_MESSAGE, PROGRESS, ROOTS_LIST
from bastion.stopping import cancel_and_wait
from bastion.upstream.base import NotificationHandler, RelatedMessageHandler
from bastion.upstream.ids import RequestIds

__all__ = ["CLEANUP_TIMEOUT", "MAX_SERVING", "REFUSAL_REASONS", "NoisyLog", "Pending", "RefusalHandler", "RpcSession",
           "Send", "ServerRequests", "StrayHandler", "Transmit"]

log = structlog.get_logger("bastion.upstream")

Send = Callable[[dict[str, Any]], Awaitable[None]]

# Clean-up sent to an upstream after its caller has been answered (a cancellation notice, the answer to one of its
# own requests) gets this long; a frozen upstream must not pin a task, a connection or a socket forever.
CLEANUP_TIMEOUT = 5.0
# Ids of finished requests remembered to tell a late answer from one to an id never sent.
_FINISHED_MEMORY = 4096
# Requests from one upstream connection bastion serves or relays at once (ping, roots/list, sampling, elicitation).
MAX_SERVING = 32
# Per-message warnings about one connection: a burst, then this many a second; the others are counted in the next
# one logged (``suppressed``).
_NOISY_BURST = 20
_NOISY_PER_S = 1.0
# Stray responses logged per connection and reason: every one of the first, then one in so many.
_STRAY_LOG_FIRST = 100
_STRAY_LOG_EVERY = 1000

# (upstream name, reason): one stray response was dropped. Reasons: unknown_id, late, duplicate, wrong_stream,
# malformed_id.
StrayHandler = Callable[[str, str], None]
# (upstream name, reason): one request from the upstream was refused. Reasons: REFUSAL_REASONS.
RefusalHandler = Callable[[str, str], None]
# Why a server request is refused, a closed set whatever the upstream sends: over the connection's bound
# (``too_many``), reusing the id of one still served (``duplicate_id``), from a 2026-07-28 server, which may send
# none (``not_accepted``), outside any call that could relay it (``no_call``), or while several principals' calls
# could own it (``ambiguous``).
REFUSAL_REASONS = ("too_many", "duplicate_id", "not_accepted", "no_call", "ambiguous")


@dataclass(frozen=True, slots=True)
class ServerRequests:
    """How one connection treats requests its upstream sends: how many it serves at once, who hears of refusals."""

    max_serving: int = MAX_SERVING
    on_refused: RefusalHandler | None = None


DEFAULT_SERVER_REQUESTS = ServerRequests()


@dataclass(slots=True, eq=False)
class Pending:
    """One request in flight. Its id doubles as the progress token the upstream sees."""

    id: int
    message: dict[str, Any]
    future: asyncio.Future[dict[str, Any]]
    on_message: RelatedMessageHandler | None
    client_token: Any = None


Transmit = Callable[[Pending], Awaitable[None]]


def owner_of(handler: RelatedMessageHandler | None) -> str | None:
    """The principal a request's message handler relays to, when the handler says (``owner`` attribute)."""
    owner = getattr(handler, "owner", None)
    return owner if isinstance(owner, str) else None


def reaches_client(handler: RelatedMessageHandler | None) -> bool:
    """Whether a request's message handler can pass a message on to its client now (``reaches_client``
    attribute; a handler that does not say can). A caller's request whose answer is not a stream (a
    ``prompts/get``) still has a handler, which says whose request it is, but nothing it gets reaches anyone."""
    return getattr(handler, "reaches_client", True) is not False


def audience_of(handler: RelatedMessageHandler | None) -> object:
    """The client a request's message handler relays to (``audience`` attribute: its session); a handler that
    does not say is its own audience."""
    audience = getattr(handler, "audience", None)
    return audience if isinstance(audience, str) else handler


async def _ignore(method: str, params: Mapping[str, Any]) -> None:
    return None


def _no_stray(upstream: str, reason: str) -> None:
    return None


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_id(value: Any) -> TypeGuard[int | str]:
    """JSON-RPC ids are strings or integers; anything else (and ``bool``) cannot be hashed or compared safely."""
    return isinstance(value, str) or _is_int(value)


class NoisyLog:
    """Warnings a peer's messages cause, one per message: rate-limited (``TokenBucket``), with the number left out
    since the last one logged in ``suppressed``."""

    __slots__ = ("_bucket", "_suppressed")

    def __init__(self, burst: float = _NOISY_BURST, per_s: float = _NOISY_PER_S) -> None:
        self._bucket = TokenBucket(burst, per_s)
        self._suppressed = 0

    def __call__(self, emit: Callable[..., Any], event: str, **fields: Any) -> bool:
        if not self._bucket.take(time.monotonic()):
            self._suppressed += 1
            return False
        if self._suppressed:
            fields["suppressed"] = self._suppressed
            self._suppressed = 0
        emit(event, **fields)
        return True


class RpcSession:
    def __init__(self, name: str, send: Send, *, on_stray: StrayHandler | None = None,
                 server_requests: ServerRequests = DEFAULT_SERVER_REQUESTS) -> None:
        self.name = name
        self._max_serving = server_requests.max_serving
        self._on_refused: RefusalHandler = server_requests.on_refused or _no_stray
        self.on_notification: NotificationHandler = _ignore
        self.on_stray: StrayHandler = on_stray or _no_stray
        # Era-dependent, set by the transport once it knows the era: 2026-07-28 servers must not send requests
        # (so none is relayed to a client), and over HTTP a request is cancelled by closing its stream instead.
        self.accept_server_requests = True
        self.cancel_by_notice = True
        self._send = send
        self._ids = RequestIds()
        # Every request's deadline on one timer (bastion.deadlines): nearly all of them are answered in time.
        self._deadlines = Deadlines()
        self._pending: dict[int, Pending] = {}
        # Recently finished ids, oldest first (a dict as an ordered set), to classify late answers.
        self._finished: dict[int, None] = {}
        self._stray_counts: dict[str, int] = {}
        # Server requests being served, by their id: at most ``_max_serving`` (``handle``).
        self._serving: dict[Any, asyncio.Task[None]] = {}
        self.noisy = NoisyLog()
        self._background: set[asyncio.Task[None]] = set()
        # Requests whose caller gave up while the upstream may still be working on them, for the slots their calls
        # hold over until it is done (``bastion.holdover``): its answer, the connection's end, or the grace period.
        self._abandoned: dict[int, Abandoned] = {}

    # -- outgoing --------------------------------------------------------------------------------------------

    def open(self, method: str, params: Mapping[str, Any] | None, on_message: RelatedMessageHandler | None) -> Pending:
        rid = self._ids.next()
        while rid in self._pending or rid in self._finished:  # pragma: no cover - a permutation never repeats
            rid = self._ids.next()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        client_token = None
        if params is not None:
            body = params if isinstance(params, dict) else dict(params)
            meta = body.get("_meta")
            if isinstance(meta, Mapping) and "progressToken" in meta:
                # Clients' tokens are only unique per client; ours must be unique per upstream.
                client_token = meta["progressToken"]
                body = {**body, "_meta": {**meta, "progressToken": rid}}
            message["params"] = body
        pending = Pending(rid, message, asyncio.get_running_loop().create_future(), on_message, client_token)
        self._pending[rid] = pending
        return pending

    async def call(self, method: str, params: Mapping[str, Any] | None, *, timeout: float | None,
                   on_message: RelatedMessageHandler | None, transmit: Transmit,
                   reported_timeout: float | None = None) -> dict[str, Any]:
        """``timeout=None`` is for requests meant to last (a ``subscriptions/listen`` stream). ``timeout`` is what
        is left of the caller's deadline; ``reported_timeout`` the configured one its error names, when they
        differ (time already spent waiting for a reconnect, or on an earlier attempt)."""
        pending = self.open(method, params, on_message)
        try:
            with self._deadlines.after(timeout):
                await transmit(pending)
                response = await pending.future
        except TimeoutError:
            # The caller's answer leaves now. The notice goes out in the background under a deadline of its own:
            # awaiting it here would hold the caller for as long as a frozen upstream takes to read it.
            self._abandon(pending, reported_timeout or timeout)
            self.spawn(self.cancel(pending.id, "timeout"))
            raise UpstreamTimeout(self.name, reported_timeout or timeout or 0.0) from None
        except asyncio.CancelledError:
            # This task is being cancelled, so the notice goes out from a task of its own.
            self._abandon(pending, reported_timeout or timeout)
            self.spawn(self.cancel(pending.id, "cancelled"))
            raise
        finally:
            self._finish(pending)
        return self._result(response)

    def _abandon(self, pending: Pending, grace_s: float | None) -> None:
        """The caller stops waiting while the upstream may go on: when the call holds slots for its work (a
        concurrency lease), they stay held until the upstream is done with this request (``bastion.holdover``)."""
        hold = current_hold()
        future = pending.future
        if hold is None or hold.closed or grace_s is None or (future.done() and not future.cancelled()):
            # No slot to keep, a request meant to last (listen), or the answer (or the connection's end) is in; the
            # cancellation of the caller's task cancels the future it awaited, which says nothing of the upstream.
            return
        rid = pending.id
        abandoned = Abandoned(self.name, rid, grace_s)
        self._abandoned[rid] = abandoned

        def forget(_reason: str) -> None:
            self._abandoned.pop(rid, None)

        abandoned.hold(forget)
        hold.abandoned.append(abandoned)

    def end_abandoned(self, reason: str) -> None:
        """The upstream's work on every abandoned request is over (its connection or process is gone)."""
        for abandoned in list(self._abandoned.values()):
            abandoned.end(reason)

    @property
    def abandoned(self) -> int:
        """Abandoned requests the upstream may still be working on."""
        return len(self._abandoned)

    @staticmethod
    def remaining(deadline: float) -> float:
        """Seconds left until ``deadline`` (event-loop time), never negative."""
        return max(0.0, deadline - asyncio.get_running_loop().time())

    def forget(self, pending: Pending) -> None:
        """Drop a request opened with ``open`` but not run through ``call`` (the HTTP era probe)."""
        self._finish(pending)

    def _finish(self, pending: Pending) -> None:
        if self._pending.pop(pending.id, None) is None:
            return
        self._finished[pending.id] = None
        if len(self._finished) > _FINISHED_MEMORY:
            del self._finished[next(iter(self._finished))]

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """Send a notification. Bounded by ``CLEANUP_TIMEOUT``: a notification has no answer to wait for, and an
        upstream that does not take it in that long (frozen, its HTTP endpoint never answering the POST) must not
        hold whoever sent it, be it a connect, a re-initialization inside a caller's request, or a cancellation."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = dict(params)
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT):
                await self._send(message)
        except TimeoutError:
            raise UpstreamUnavailable(self.name, log_detail=f"{method} not delivered within {CLEANUP_TIMEOUT:g} s"
                                      ) from None

    async def cancel(self, request_id: int, reason: str) -> None:
        """Tell the upstream to stop working on a request; bounded (see ``notify``), never raises."""
        if not self.cancel_by_notice:
            return
        try:
            await self.notify(CANCELLED, {"requestId": request_id, "reason": reason})
        except UpstreamUnavailable as exc:
            log.info("upstream.cancel_failed", upstream=self.name, request_id=request_id, detail=exc.log_detail)

    def _result(self, response: dict[str, Any]) -> dict[str, Any]:
        error = response.get("error")
        if error is not None:
            err = read_error(error, "Upstream error")
            raise UpstreamRpcError(err.code, err.message, data=err.data)
        result = response.get("result")
        if not isinstance(result, dict):
            raise UpstreamRpcError(INTERNAL_ERROR, "Upstream sent a malformed response",
                                   log_detail=f"upstream {self.name} result is {type(result).__name__}")
        return result

    def fail_all(self, detail: str) -> None:
        """The connection is gone: every request in flight fails now rather than at its timeout."""
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(UpstreamUnavailable(self.name, log_detail=detail))
        for task in self._serving.values():
            task.cancel()
        self.end_abandoned("connection_lost")

    # -- incoming --------------------------------------------------------------------------------------------

    async def handle(self, message: Any, related: Pending | None = None, *, answers: bool = True) -> None:
        """One message from the upstream. ``related``: the request whose stream carried it, when the transport
        knows; ``answers=False``: the stream it came on never carries responses (the HTTP GET stream)."""
        if not isinstance(message, dict):
            self.noisy(log.warning, "upstream.bad_message", upstream=self.name, kind=type(message).__name__)
            return
        method = message.get("method")
        if method is None:
            self._resolve(message, related, answers)
        elif not isinstance(method, str):
            self.noisy(log.warning, "upstream.bad_message", upstream=self.name, kind="method is not a string")
        elif "id" in message:
            rid = message["id"]
            if not _valid_id(rid):
                self.noisy(log.warning, "upstream.bad_message", upstream=self.name,
                           kind="request id is not a string or integer")
                return
            if rid in self._serving:
                await self._refuse(rid, method, "duplicate_id", ProtocolError(
                    INVALID_REQUEST, "request id already in use by a request bastion is still serving"))
                return
            if len(self._serving) >= self._max_serving:
                await self._refuse(rid, method, "too_many", ProtocolError(
                    RATE_LIMITED, f"too many requests in flight: bastion serves at most {self._max_serving} at "
                    "once per connection"))
                return
            task = self.spawn(self._serve(rid, method, message.get("params"), related))
            self._serving[rid] = task
            task.add_done_callback(lambda _t: self._serving.pop(rid, None))
        else:
            params = message.get("params")
            await self._notification(method, params if isinstance(params, dict) else {}, related, answers)

    def _resolve(self, message: dict[str, Any], related: Pending | None, answers: bool) -> None:
        rid = message.get("id")
        if rid is None and related is not None and answers and "error" in message:
            # JSON-RPC's null id: the server could not read our request's id. On that request's own stream the
            # error can only be about that request.
            message = {**message, "id": related.id}
            rid = related.id
        pending = self._pending.get(rid) if _is_int(rid) else None
        if not answers or (related is not None and pending is not related):
            reason = "wrong_stream"
        elif pending is not None:
            if not pending.future.done():
                pending.future.set_result(message)
                return
            reason = "duplicate"
        elif not _valid_id(rid):
            reason = "malformed_id"
        elif _is_int(rid) and rid in self._abandoned:
            # The answer to a request its caller gave up on: the upstream is done with it, its slots are free.
            self._abandoned[rid].end("answered")
            reason = "late"
        elif _is_int(rid) and rid in self._finished:
            reason = "late"
        else:
            reason = "unknown_id"
        self._stray(reason, rid, related)

    def _stray(self, reason: str, rid: Any, related: Pending | None) -> None:
        # A late answer is what a slow upstream produces after a timeout; everything else is a broken or hostile
        # upstream, worth an operator's attention. A flood is logged sparsely (the metric counts every one), so a
        # hostile upstream cannot drown the gateway's log.
        count = self._stray_counts[reason] = self._stray_counts.get(reason, 0) + 1
        if count <= _STRAY_LOG_FIRST or count % _STRAY_LOG_EVERY == 0:
            emit = log.info if reason == "late" else log.warning
            emit("upstream.stray_response", upstream=self.name, reason=reason, id=str(rid)[:64],
                 stream=related.id if related is not None else None, total=count)
        try:
            self.on_stray(self.name, reason)
        except Exception:
            log.exception("upstream.stray_handler_failed", upstream=self.name)

    async def _notification(self, method: str, params: dict[str, Any], related: Pending | None,
                            answers: bool = True) -> None:
        target = related if related is not None else self._subscription(params)
        if method == PROGRESS:
            token = params.get("progressToken")
            owner = self._pending.get(token) if _is_int(token) else None
            if owner is None or owner.client_token is None or (related is not None and owner is not related):
                # Progress for another request's token on this request's stream is as stray as its response.
                log.debug("upstream.stray_progress", upstream=self.name, token=str(token)[:64])
                return
            target = owner
            params = {**params, "progressToken": owner.client_token}
        elif method == CANCELLED:
            rid = params.get("requestId")
            task = self._serving.get(rid) if _valid_id(rid) else None
            if task is not None:
                task.cancel()
            ours = self._pending.get(rid) if _is_int(rid) else None
            if ours is not None and not ours.future.done():
                # A modern stdio server ends a subscription this way.
                ours.future.set_exception(UpstreamUnavailable(self.name, log_detail=f"server cancelled {rid}"))
            abandoned = self._abandoned.get(rid) if _is_int(rid) else None
            if abandoned is not None:
                abandoned.end("answered")  # the server says it stopped working on it
            return
        if target is None and method == LOG_MESSAGE and answers:
            # stdio has no per-request stream: a log message during calls goes to every caller in flight, once
            # each, rather than to a guess that may miss the call that caused it. On the HTTP GET stream
            # (``answers=False``) messages are unrelated by definition.
            audiences = self._log_audiences()
            if audiences:
                for pending in audiences:
                    await self._deliver(pending, method, params)
                return
        if target is not None:
            await self._deliver(target, method, params)
            return
        try:
            await self.on_notification(method, params)
        except Exception:
            log.exception("upstream.notification_handler_failed", upstream=self.name, method=method)

    async def _deliver(self, target: Pending, method: str, params: dict[str, Any]) -> None:
        if target.on_message is None:
            return
        try:
            await target.on_message(method, params)
        except Exception:
            log.exception("upstream.notification_handler_failed", upstream=self.name, method=method)

    def _log_audiences(self) -> list[Pending]:
        """The in-flight calls an unattributed log message goes to: the most recent of each client's."""
        latest: dict[object, Pending] = {}
        for pending in self._candidates():  # insertion order is send order: later ones win
            if reaches_client(pending.on_message):
                latest[audience_of(pending.on_message)] = pending
        return list(latest.values())

    def _subscription(self, params: Mapping[str, Any]) -> Pending | None:
        """The ``subscriptions/listen`` request a stdio notification belongs to, by its subscription id."""
        meta = params.get("_meta")
        sid = meta.get(SUBSCRIPTION_ID) if isinstance(meta, Mapping) else None
        if _is_int(sid):
            return self._pending.get(sid)
        return None

    def _candidates(self) -> list[Pending]:
        """Every in-flight request an unattributed message could belong to: each one made on a caller's behalf,
        whether or not it can pass anything on (``Gateway.forward`` gives each such request its caller's handler;
        a request without one is bastion's own, which carries nobody's data). A modern ``subscriptions/listen``
        request gets only messages tagged with its subscription id (``_subscription``); it never owns an untagged
        one."""
        return [p for p in self._pending.values()
                if p.on_message is not None and not p.future.done() and p.message.get("method") != LISTEN]

    def _route(self) -> Pending | None:
        """The in-flight request an unattributed message belongs to: the only one that could own it, or, when
        several could and every one of them was made by the same principal (``owner_of``), the most recently
        sent of those that can reach their client. A guess within one principal's own requests hands nobody
        another caller's data; across principals it could, so then there is no owner. Requests that cannot relay
        anything count as much as those that can: the request that asked may well be one of them (a
        ``prompts/get`` that samples), and a call that can relay must not be handed another caller's question."""
        candidates = self._candidates()
        if len(candidates) > 1:
            owners = {owner_of(p.on_message) for p in candidates}
            if len(owners) != 1 or None in owners:
                return None
        reachable = [p for p in candidates if reaches_client(p.on_message)]
        return (reachable or candidates)[-1] if candidates else None  # insertion order is send order

    async def _serve(self, rid: Any, method: str, params: Any, related: Pending | None) -> None:
        response: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
        target = related if related is not None else self._route()
        try:
            if method == "ping":
                response["result"] = {}
            elif not self.accept_server_requests:
                self._refused(method, "not_accepted")
                raise ProtocolError(METHOD_NOT_FOUND, f"Method not found: {method}")
            elif target is None or target.on_message is None:
                if method == ROOTS_LIST:
                    # bastion offers ``roots`` to upstreams, so it answers; outside a call (or when it cannot
                    # tell whose call this is) no client's roots may be shared: the truthful answer is none.
                    response["result"] = {"roots": []}
                elif target is None and len(self._candidates()) > 1:
                    self._refused(method, "ambiguous", event="upstream.server_request_ambiguous")
                    raise ProtocolError(INTERNAL_ERROR, f"{method} cannot be attributed to one of several requests "
                                        "in flight; bastion relays it only on a request's own stream")
                else:
                    self._refused(method, "no_call", level=log.info)
                    raise ProtocolError(METHOD_NOT_FOUND, f"Method not found: {method}")
            else:
                result = await target.on_message(method, params if isinstance(params, dict) else {})
                response["result"] = dict(result) if result is not None else {}
        except ProtocolError as exc:
            response["error"] = exc.to_error()
        except Exception:
            log.exception("upstream.server_request_failed", upstream=self.name, method=method[:100])
            response["error"] = {"code": INTERNAL_ERROR, "message": "Internal error"}
        await self._answer(response, method)

    async def _refuse(self, rid: Any, method: str, reason: str, error: ProtocolError) -> None:
        """Refuse one server request without serving it: answered here, in the reader's turn (see the module)."""
        self._refused(method, reason, detail=error.message)
        await self._answer({"jsonrpc": "2.0", "id": rid, "error": error.to_error()}, method)

    def _refused(self, method: str, reason: str, *, event: str = "upstream.server_request_refused",
                 level: Callable[..., Any] = log.warning, detail: str | None = None) -> None:
        """Count one refused server request (every one) and log it (rate-limited, ``noisy``)."""
        try:
            self._on_refused(self.name, reason)
        except Exception:
            log.exception("upstream.refusal_handler_failed", upstream=self.name)
        fields: dict[str, Any] = {"upstream": self.name, "method": method[:100], "reason": reason}
        if detail is not None:
            fields["detail"] = detail
        self.noisy(level, event, **fields)

    async def _answer(self, response: dict[str, Any], method: str) -> None:
        """Send the answer to a server request; bounded (``CLEANUP_TIMEOUT``), never raises."""
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT):
                await self._send(response)
        except TimeoutError:
            self.noisy(log.info, "upstream.answer_failed", upstream=self.name, method=method[:100],
                       detail=f"not delivered within {CLEANUP_TIMEOUT:g} s")
        except UpstreamUnavailable as exc:
            self.noisy(log.info, "upstream.answer_failed", upstream=self.name, method=method[:100],
                       detail=exc.log_detail)

    # -- housekeeping ----------------------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A background task that is kept referenced until done, and cancelled by ``aclose``."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def aclose(self) -> None:
        futures = [p.future for p in self._pending.values()]
        self.fail_all("upstream closed")
        await cancel_and_wait(list(self._background))
        for future in futures:
            # Their awaiting tasks may have been cancelled above; mark the failures seen so asyncio does not warn.
            if future.done() and not future.cancelled():
                future.exception()
