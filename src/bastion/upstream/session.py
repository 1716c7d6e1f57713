"""What every transport shares: request ids, pending answers, progress-token mapping, and routing of what the
upstream sends back.

A transport owns only its framing. It hands ``RpcSession`` a ``send`` for whole messages (used for answers to
server requests and for cancellations), gives ``call`` a ``transmit`` that puts one request on the wire, and
feeds every message it reads to ``handle``. The session does the rest, identically for stdio, Streamable HTTP
and legacy HTTP+SSE.

Routing of upstream-initiated messages:
- a response resolves the pending request with its id (late or unknown ids are logged and dropped);
- ``notifications/progress`` goes to the request whose rewritten token it carries, with the caller's token put
  back; other notifications go to the request whose stream carried them (``related``, Streamable HTTP) or, when
  no stream says so, to ``on_notification``;
- a server request (``sampling/createMessage``, ``elicitation/create``, ``roots/list``) goes to ``related``
  when the transport knows it; otherwise (stdio, GET streams) to the only in-flight request that accepts
  messages, or, when several do, the most recently sent one. ``ping`` is answered here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from bastion.errors import (
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    ProtocolError,
    UpstreamRpcError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.upstream.base import NotificationHandler, RelatedMessageHandler

__all__ = ["Pending", "RpcSession", "Send", "Transmit"]

log = structlog.get_logger("bastion.upstream")

Send = Callable[[dict[str, Any]], Awaitable[None]]

PROGRESS = "notifications/progress"
LOG_MESSAGE = "notifications/message"
CANCELLED = "notifications/cancelled"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


@dataclass(slots=True, eq=False)
class Pending:
    """One request in flight. Its id doubles as the progress token the upstream sees."""

    id: int
    message: dict[str, Any]
    future: asyncio.Future[dict[str, Any]]
    on_message: RelatedMessageHandler | None
    client_token: Any = None


Transmit = Callable[[Pending], Awaitable[None]]


async def _ignore(method: str, params: Mapping[str, Any]) -> None:
    return None


class RpcSession:
    def __init__(self, name: str, send: Send) -> None:
        self.name = name
        self.on_notification: NotificationHandler = _ignore
        # Era-dependent, set by the transport once it knows the era: 2026-07-28 servers must not send requests
        # (so none is relayed to a client), and over HTTP a request is cancelled by closing its stream instead.
        self.accept_server_requests = True
        self.cancel_by_notice = True
        self._send = send
        self._next_id = 0
        # Insertion order is send order, which the server-request routing rule relies on.
        self._pending: dict[int, Pending] = {}
        self._serving: dict[Any, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- outgoing --------------------------------------------------------------------------------------------

    def open(self, method: str, params: Mapping[str, Any] | None, on_message: RelatedMessageHandler | None) -> Pending:
        self._next_id += 1
        rid = self._next_id
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
                   on_message: RelatedMessageHandler | None, transmit: Transmit) -> dict[str, Any]:
        """``timeout=None`` is for requests meant to last (a ``subscriptions/listen`` stream)."""
        pending = self.open(method, params, on_message)
        try:
            async with asyncio.timeout(timeout):
                await transmit(pending)
                response = await pending.future
        except TimeoutError:
            await self.cancel(pending.id, "timeout")
            raise UpstreamTimeout(self.name, timeout or 0.0) from None
        except asyncio.CancelledError:
            # This task is being cancelled, so the notice goes out from a task of its own.
            self.spawn(self.cancel(pending.id, "cancelled"))
            raise
        finally:
            del self._pending[pending.id]
        return self._result(response)

    def forget(self, pending: Pending) -> None:
        """Drop a request opened with ``open`` but not run through ``call`` (the HTTP era probe)."""
        self._pending.pop(pending.id, None)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = dict(params)
        await self._send(message)

    async def cancel(self, request_id: int, reason: str) -> None:
        if not self.cancel_by_notice:
            return
        try:
            await self.notify(CANCELLED, {"requestId": request_id, "reason": reason})
        except UpstreamUnavailable as exc:
            log.info("upstream.cancel_failed", upstream=self.name, request_id=request_id, detail=exc.log_detail)

    def _result(self, response: dict[str, Any]) -> dict[str, Any]:
        error = response.get("error")
        if error is not None:
            if not isinstance(error, Mapping):
                error = {}
            code = error.get("code")
            message = error.get("message")
            data = error.get("data")
            raise UpstreamRpcError(
                code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR,
                message if isinstance(message, str) else "Upstream error",
                data=data if isinstance(data, Mapping) else None,
            )
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

    # -- incoming --------------------------------------------------------------------------------------------

    async def handle(self, message: Any, related: Pending | None = None) -> None:
        if not isinstance(message, dict):
            log.warning("upstream.bad_message", upstream=self.name, kind=type(message).__name__)
            return
        method = message.get("method")
        if method is None:
            self._resolve(message)
        elif not isinstance(method, str):
            log.warning("upstream.bad_message", upstream=self.name, kind="method is not a string")
        elif "id" in message:
            rid = message["id"]
            task = self.spawn(self._serve(rid, method, message.get("params"), related))
            self._serving[rid] = task
            task.add_done_callback(lambda _t: self._serving.pop(rid, None))
        else:
            params = message.get("params")
            await self._notification(method, params if isinstance(params, dict) else {}, related)

    def _resolve(self, message: dict[str, Any]) -> None:
        rid = message.get("id")
        pending = self._pending.get(rid) if isinstance(rid, int) and not isinstance(rid, bool) else None
        if pending is None or pending.future.done():
            log.debug("upstream.late_response", upstream=self.name, id=rid)
            return
        pending.future.set_result(message)

    async def _notification(self, method: str, params: dict[str, Any], related: Pending | None) -> None:
        target = related if related is not None else self._subscription(params)
        if method == PROGRESS:
            token = params.get("progressToken")
            target = self._pending.get(token) if isinstance(token, int) and not isinstance(token, bool) else None
            if target is None or target.client_token is None:
                return
            params = {**params, "progressToken": target.client_token}
        elif method == CANCELLED:
            rid = params.get("requestId")
            task = self._serving.get(rid)
            if task is not None:
                task.cancel()
            ours = self._pending.get(rid) if isinstance(rid, int) and not isinstance(rid, bool) else None
            if ours is not None and not ours.future.done():
                # A modern stdio server ends a subscription this way.
                ours.future.set_exception(UpstreamUnavailable(self.name, log_detail=f"server cancelled {rid}"))
            return
        if target is None and method == LOG_MESSAGE:
            # stdio has no per-request stream: a log message during a call belongs to that call, by the same
            # routing rule as server-to-client requests.
            target = self._route()
        try:
            if target is not None:
                if target.on_message is not None:
                    await target.on_message(method, params)
            else:
                await self.on_notification(method, params)
        except Exception:
            log.exception("upstream.notification_handler_failed", upstream=self.name, method=method)

    def _subscription(self, params: Mapping[str, Any]) -> Pending | None:
        """The ``subscriptions/listen`` request a stdio notification belongs to, by its subscription id."""
        meta = params.get("_meta")
        sid = meta.get(SUBSCRIPTION_ID) if isinstance(meta, Mapping) else None
        if isinstance(sid, int) and not isinstance(sid, bool):
            return self._pending.get(sid)
        return None

    def _route(self) -> Pending | None:
        for pending in reversed(self._pending.values()):
            if pending.on_message is not None and not pending.future.done():
                return pending
        return None

    async def _serve(self, rid: Any, method: str, params: Any, related: Pending | None) -> None:
        response: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
        target = related if related is not None else self._route()
        try:
            if method == "ping":
                response["result"] = {}
            elif not self.accept_server_requests:
                log.warning("upstream.server_request_refused", upstream=self.name, method=method)
                raise ProtocolError(METHOD_NOT_FOUND, f"Method not found: {method}")
            elif target is None or target.on_message is None:
                raise ProtocolError(METHOD_NOT_FOUND, f"Method not found: {method}")
            else:
                result = await target.on_message(method, params if isinstance(params, dict) else {})
                response["result"] = dict(result) if result is not None else {}
        except ProtocolError as exc:
            response["error"] = exc.to_error()
        except Exception:
            log.exception("upstream.server_request_failed", upstream=self.name, method=method)
            response["error"] = {"code": INTERNAL_ERROR, "message": "Internal error"}
        try:
            await self._send(response)
        except UpstreamUnavailable as exc:
            log.info("upstream.answer_failed", upstream=self.name, method=method, detail=exc.log_detail)

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
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for future in futures:
            # Their awaiting tasks may have been cancelled above; mark the failures seen so asyncio does not warn.
            if future.done() and not future.cancelled():
                future.exception()
