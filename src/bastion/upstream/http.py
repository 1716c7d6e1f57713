"""An upstream MCP server over Streamable HTTP, in its handshake era (2025-03-26 … 2025-11-25).

Each request is one POST, on the upstream's lean keep-alive pool (``connections``) when it has one, else on the shared
``httpx.AsyncClient``; the answer is either one JSON object or an SSE stream that carries the request's related
notifications and server requests before its response. Server requests are answered by POSTing the JSON-RPC
response. A 404 on a request that carried our session id means the server forgot the session (typically it
restarted): we initialize again and retry that request once. A re-initialization that fails (the restarted
server answers ``initialize`` with an error, or not in time) leaves no session: the next request, a health probe's
included, initializes first, so the upstream comes back as soon as its server does. A GET stream, when the server
offers one, brings unrelated notifications such as ``tools/list_changed``. A session the server froze (it keeps the
connections but answers nothing in it, not even with a 404) would be asked again by every probe for ever:
``restart`` leaves it for a new one when the upstream's health finds it ``down``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import orjson
import structlog

from bastion import __version__
from bastion.errors import RequestError, UpstreamUnavailable
from bastion.protocol.methods import INITIALIZE, INITIALIZED, TOOLS_LIST_CHANGED
from bastion.sse import SseDecoder
from bastion.stopping import cancel_and_wait
from bastion.upstream.base import NotificationHandler, RelatedMessageHandler, UpstreamInfo
from bastion.upstream.bodies import DEFAULT_MAX_MESSAGE_BYTES
from bastion.upstream.connections import H1Pool
from bastion.upstream.handshake import initialize_params, parse_initialize_result
from bastion.upstream.httpio import (
    HTTPX_HEADERS,
    STREAM_TIMEOUT,
    HttpPeer,
    ResponseLike,
    http_errors,
    is_event_stream,
    read_body,
    sse_events,
    trace_headers,
)
from bastion.upstream.session import (
    CLEANUP_TIMEOUT,
    DEFAULT_SERVER_REQUESTS,
    Pending,
    RpcSession,
    ServerRequests,
    StrayHandler,
)
from bastion.upstream.supervisor import Backoff, StateListener

__all__ = ["HttpUpstream"]

log = structlog.get_logger("bastion.upstream")

SESSION_HEADER = "Mcp-Session-Id"
# httpx's headers are case-insensitive, the lean pool's are lower-cased: the lower-case name reads both.
SESSION_HEADER_LOWER = SESSION_HEADER.lower()
VERSION_HEADER = "MCP-Protocol-Version"


class HttpUpstream(HttpPeer):
    def __init__(self, name: str, url: str, headers: Mapping[str, str], client: httpx.AsyncClient, *,
                 init_timeout: float = 30.0, listen: bool = True, backoff_initial: float = 0.5,
                 backoff_max: float = 30.0, fast: H1Pool | None = None, on_stray: StrayHandler | None = None,
                 server_requests: ServerRequests = DEFAULT_SERVER_REQUESTS,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        super().__init__(name, url, headers, client, init_timeout=init_timeout, listen=listen, fast=fast,
                         max_message_bytes=max_message_bytes)
        self._backoff = Backoff(backoff_initial, backoff_max)
        # Rebuilt once per (re)initialization, so the hot path does no header assembly.
        self._headers = dict(self._base_headers)
        self._session_id: str | None = None
        self._generation = 0
        # Set while the session is lost and not yet replaced (a re-initialization failed); see ``_transmit``.
        self._sessionless = False
        self._init_lock = asyncio.Lock()
        self._rpc = RpcSession(name, self._post_message, on_stray=on_stray, server_requests=server_requests)
        self._listener: asyncio.Task[None] | None = None
        self._stream_answered = asyncio.Event()
        self._on_state: StateListener | None = None
        # Whether ``restart`` is leaving a frozen session; the pace of such renewals, and when the last one began.
        self._renewing = False
        self._renewals = Backoff(backoff_initial, backoff_max)
        self._renewed_at = -math.inf

    def watch(self, listener: StateListener) -> None:
        """Hear when the GET stream ends or fails ("suspect"): often the first sign that the server died, so the
        health monitor probes at once instead of at its next interval."""
        self._on_state = listener

    async def start(self, on_notification: NotificationHandler) -> UpstreamInfo:
        # Also after ``close``: the pool retries a failed start on the same object, which must then act as new.
        self._closed = False
        self._stream_answered.clear()
        self._backoff.reset()
        self._rpc.on_notification = on_notification
        info = await self._initialize()
        if self._listen_enabled:
            self._listener = self._rpc.spawn(self._listen())
            # The server drops notifications sent before it saw our GET stream; a tool call made right after start
            # could otherwise change the tool list unseen. So wait for the stream's answer, but never fail on it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._init_timeout):
                    await self._stream_answered.wait()
        return info

    async def request(self, method: str, params: Mapping[str, Any] | None, *, timeout: float,
                      on_message: RelatedMessageHandler | None = None) -> dict[str, Any]:
        if self._closed or self._info is None:
            raise UpstreamUnavailable(self.name, log_detail="not connected")
        return await self._rpc.call(method, params, timeout=timeout, on_message=on_message, transmit=self._transmit)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        await self._rpc.notify(method, params)

    def restart(self, reason: str) -> bool:
        """Leave a session that no longer answers (health ``down`` while the server keeps its connections) for a
        new one (``_renew``). Unlike a supervised transport it reports no ``restarting``: a server that cannot be
        reached at all stays ``down`` as before, its calls failing fast. False without a session (each request to
        a stateless server is a new exchange, which reaches it once it answers), when not connected, or while a
        restart is under way."""
        if self._closed or self._info is None or self._session_id is None or self._renewing:
            return False
        log.warning("upstream.restart", upstream=self.name, session=True, reason=reason)
        self._renewing = True
        self._rpc.spawn(self._renew())
        return True

    async def close(self) -> None:
        self._closed = True
        self._info = None
        await self._rpc.aclose()  # also ends the GET stream's task
        self._listener = None
        if self._session_id is not None:
            await self._delete_session(self._headers)
            self._session_id = None

    async def _delete_session(self, headers: Mapping[str, str]) -> None:
        """End the session ``headers`` name. Bounded: a frozen upstream must not hold the gateway's shutdown."""
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT):
                with http_errors(self.name, "DELETE"):
                    async with self._client.stream("DELETE", self._url, headers={**headers, **HTTPX_HEADERS}
                                                   ) as response:
                        await read_body(response, self.name, self._max_message)
        except TimeoutError:
            log.info("upstream.delete_failed", upstream=self.name, detail=f"no answer within {CLEANUP_TIMEOUT:g} s")
        except UpstreamUnavailable as exc:
            log.info("upstream.delete_failed", upstream=self.name, detail=exc.log_detail)

    # -- session ---------------------------------------------------------------------------------------------

    async def _initialize(self) -> UpstreamInfo:
        self._session_id = None
        self._headers = dict(self._base_headers)
        # Until this succeeds there is no session to send requests in: without one, a server answers them with a
        # 400 that looks like no lost session, and nothing would initialize again.
        self._sessionless = True
        result = await self._rpc.call(INITIALIZE, initialize_params(__version__), timeout=self._init_timeout,
                                      on_message=None, transmit=self._transmit_initialize)
        info = parse_initialize_result(self.name, result)
        self._headers = self._session_headers(info.protocol_version)
        self._info = info
        self._generation += 1
        self._sessionless = False
        await self._rpc.notify(INITIALIZED)
        log.info("upstream.initialized", upstream=self.name, version=info.protocol_version,
                 session=self._session_id is not None)
        return info

    def _session_headers(self, version: str) -> dict[str, str]:
        headers = {**self._base_headers, VERSION_HEADER: version}
        if self._session_id is not None:
            headers[SESSION_HEADER] = self._session_id
        return headers

    async def _reinitialize(self, generation: int) -> None:
        async with self._init_lock:
            if generation != self._generation:
                return  # another request already did it
            if self._sessionless:
                log.info("upstream.session_retry", upstream=self.name)
            else:
                log.info("upstream.session_expired", upstream=self.name)
                # The server forgot the session (it restarted): the work it had of ours went with it.
                self._rpc.end_abandoned("connection_lost")
            await self._initialize()
        # A server that lost our session may have restarted with a different tool list.
        await self._rpc.on_notification(TOOLS_LIST_CHANGED, {})

    async def _renew(self) -> None:
        """Leave a frozen session: its GET stream is dropped, it is DELETEd in the background (bounded: the frozen
        server may not answer that either), and one new session is initialized at once. Requests in flight are
        left to end on their own: each is an exchange of its own, which a server being stopped rather than frozen
        may still answer. Success is reported ``connected`` (the upstream is ``up``, and requests still out on the
        old session no longer count against it). A failure reports nothing: the upstream stays ``down``, failing
        calls fast, until a probe gets through, since every request (a probe's too) initializes first while there
        is no session. A server that froze each new session is left only as often as its health finds it
        ``down``."""
        try:
            listener, self._listener = self._listener, None
            if listener is not None:
                await cancel_and_wait([listener])
            self._rpc.spawn(self._delete_session(dict(self._headers)))
            # A server that freezes every session it opens is left again each time its health finds it down: the
            # backoff of a crash loop paces that (a session that lasted ``stable_after`` starts it over).
            now = time.monotonic()
            self._renewals.connection_ended(now - self._renewed_at)
            self._renewed_at = now
            delay = self._renewals.next_delay()
            if delay:
                log.info("upstream.reconnect_wait", upstream=self.name, seconds=delay)
                await asyncio.sleep(delay)
            generation = self._generation
            self._sessionless = True
            try:
                await self._reinitialize(generation)
            except RequestError as exc:
                log.warning("upstream.reconnect_failed", upstream=self.name, detail=exc.log_detail or exc.message)
            else:
                log.info("upstream.reconnected", upstream=self.name)
                self._tell("connected", "")
            if self._listen_enabled and not self._closed:
                self._listener = self._rpc.spawn(self._listen())
        finally:
            self._renewing = False

    def _tell(self, event: str, detail: str) -> None:
        if self._on_state is not None and not self._closed:
            self._on_state(event, detail)

    # -- requests --------------------------------------------------------------------------------------------

    async def _transmit_initialize(self, pending: Pending) -> None:
        await self._exchange(pending)

    async def _transmit(self, pending: Pending) -> None:
        generation = self._generation
        if self._sessionless:
            await self._reinitialize(generation)
            generation = self._generation
        if await self._exchange(pending):
            await self._reinitialize(generation)
            if await self._exchange(pending):
                raise UpstreamUnavailable(self.name, log_detail="session rejected right after initialize")

    async def _exchange(self, pending: Pending) -> bool:
        """POST one request and read its answer into the session. True when the server forgot our session."""
        with http_errors(self.name, "POST"):
            async with self._post(orjson.dumps(pending.message), trace_headers(pending.message)) as response:
                status = response.status_code
                if status == 404 and SESSION_HEADER in self._headers:
                    return True
                if status >= 300:
                    await self._refused(response, pending)
                    return False
                if pending.message["method"] == "initialize":
                    self._session_id = response.headers.get(SESSION_HEADER_LOWER)
                if is_event_stream(response):
                    await self._read_stream(response, pending)
                else:
                    body = await read_body(response, self.name, self._max_message)
                    await self._rpc.handle(orjson.loads(body), related=pending)
        if not pending.future.done():
            raise UpstreamUnavailable(self.name, log_detail="response ended without an answer")
        return False

    def _post(self, body: bytes, extra: Mapping[str, str] | None = None) -> AbstractAsyncContextManager[ResponseLike]:
        headers = {**self._headers, **extra} if extra else self._headers
        if self._fast is not None and self._target is not None:
            return self._fast.post(self._target, headers, body)
        return self._client.stream("POST", self._url, content=body, headers={**headers, **HTTPX_HEADERS},
                                   timeout=STREAM_TIMEOUT)

    async def _read_stream(self, response: ResponseLike, pending: Pending) -> None:
        async for event in sse_events(response, self.name, SseDecoder(self._max_message)):
            if event.event == "message" and event.data:
                await self._rpc.handle(orjson.loads(event.data), related=pending)
                if pending.future.done():
                    # The answer is in; the server ends the stream after it, and waiting for that is pointless.
                    return

    async def _refused(self, response: ResponseLike, pending: Pending) -> None:
        body = await read_body(response, self.name, self._max_message)
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            message = None
        # Some servers put a JSON-RPC error for our request in a 4xx body; that is a real answer.
        if isinstance(message, dict) and message.get("id") == pending.id and "error" in message:
            await self._rpc.handle(message, related=pending)
            return
        raise UpstreamUnavailable(self.name, log_detail=f"HTTP {response.status_code}: {body[:200]!r}")

    async def _post_message(self, message: dict[str, Any]) -> None:
        with http_errors(self.name, "POST"):
            async with self._post(orjson.dumps(message)) as response:
                status = response.status_code
                await read_body(response, self.name, self._max_message)
        if status >= 300:
            raise UpstreamUnavailable(self.name, log_detail=f"HTTP {status} to a notification")

    # -- the GET stream --------------------------------------------------------------------------------------

    async def _listen(self) -> None:
        try:
            await self._listen_loop()
        finally:
            self._stream_answered.set()

    async def _listen_loop(self) -> None:
        while not self._closed:
            started = time.monotonic()
            retry_ms = await self._listen_once()
            self._stream_answered.set()
            if retry_ms is None:
                return
            self._tell("suspect", "GET stream ended")
            self._backoff.connection_ended(time.monotonic() - started)
            # The server's ``retry`` hint may slow the reconnection down to the backoff's maximum, never further:
            # past that, an upstream would switch off its own change notifications.
            await asyncio.sleep(max(self._backoff.next_delay(), min(retry_ms / 1000, self._backoff.maximum)))

    async def _listen_once(self) -> int | None:
        """One GET stream, until it ends. Returns the retry delay in ms, or None when the server offers none."""
        decoder = SseDecoder(self._max_message)
        try:
            if self._sessionless:
                # A GET without the session would be refused, or taken for the server offering no stream.
                await self._reinitialize(self._generation)
            generation = self._generation
            headers = {k: v for k, v in self._headers.items() if k != "Content-Type"}
            headers["Accept"] = "text/event-stream"
            headers.update(HTTPX_HEADERS)
            with http_errors(self.name, "GET"):
                async with self._client.stream("GET", self._url, headers=headers, timeout=STREAM_TIMEOUT) as response:
                    if response.status_code == 405:
                        log.info("upstream.no_get_stream", upstream=self.name)
                        return None
                    if response.status_code == 404 and SESSION_HEADER in headers:
                        await self._reinitialize(generation)
                        return 0
                    if response.status_code != 200 or not is_event_stream(response):
                        raise UpstreamUnavailable(self.name, log_detail=f"GET stream HTTP {response.status_code}")
                    self._stream_answered.set()
                    async for event in sse_events(response, self.name, decoder):
                        if event.event == "message" and event.data:
                            # bastion never resumes a request's stream here, so a response on it is stray.
                            await self._rpc.handle(orjson.loads(event.data), answers=False)
        except RequestError as exc:
            # Also a re-initialization answered with an error or not in time: the stream is tried again (backoff).
            log.info("upstream.get_stream_failed", upstream=self.name, detail=exc.log_detail or exc.message)
        except Exception:
            # A defect, not the upstream's doing: the stream is tried again (backoff) rather than never again.
            log.exception("upstream.stream_failed", upstream=self.name)
        return decoder.retry or 0
