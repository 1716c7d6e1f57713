"""An upstream MCP server over the deprecated HTTP+SSE transport (2024-11-05).

One long GET stream carries everything the server sends; its first event, ``endpoint``, names the URL to POST
our messages to. That URL comes from the server, so it must be same-origin with the configured one: otherwise a
compromised or confused server could point bastion, with its configured credentials, at any host (SSRF).
When the stream ends, requests in flight fail and the supervisor reconnects (a new server-side session). A stream
that stays open but no longer delivers (the server froze our session yet keeps the connection) never ends by itself:
``restart`` drops it when the upstream's health finds it ``down``, and the supervisor opens a new one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

import httpx
import orjson
import structlog

from bastion import __version__
from bastion.errors import UpstreamUnavailable
from bastion.protocol.methods import INITIALIZE, INITIALIZED, TOOLS_LIST_CHANGED
from bastion.sse import SseDecoder
from bastion.stopping import cancel_and_wait
from bastion.upstream.base import NotificationHandler, RelatedMessageHandler, UpstreamInfo
from bastion.upstream.bodies import DEFAULT_MAX_MESSAGE_BYTES
from bastion.upstream.handshake import initialize_params, parse_initialize_result
from bastion.upstream.httpio import (
    HTTPX_HEADERS,
    STREAM_TIMEOUT,
    http_errors,
    is_event_stream,
    read_body,
    same_origin,
    sse_events,
)
from bastion.upstream.session import DEFAULT_SERVER_REQUESTS, Pending, RpcSession, ServerRequests, StrayHandler
from bastion.upstream.supervisor import Backoff, StateListener, Supervisor

__all__ = ["SseUpstream"]

log = structlog.get_logger("bastion.upstream")



class SseUpstream:
    def __init__(self, name: str, url: str, headers: Mapping[str, str], client: httpx.AsyncClient, *,
                 init_timeout: float = 30.0, backoff_initial: float = 0.5, backoff_max: float = 30.0,
                 on_stray: StrayHandler | None = None,
                 server_requests: ServerRequests = DEFAULT_SERVER_REQUESTS,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.name = name
        self._url = url
        self._client = client
        self._init_timeout = init_timeout
        self._get_headers = {**headers, "Accept": "text/event-stream", **HTTPX_HEADERS}
        self._post_headers = {**headers, "Content-Type": "application/json", **HTTPX_HEADERS}
        # The most one message may take once decoded: an SSE event, a POST's answer.
        self._max_message = max_message_bytes
        self._endpoint: str | None = None
        self._stream: asyncio.Task[None] | None = None
        self._closed = False
        self._rpc = RpcSession(name, self._post, on_stray=on_stray, server_requests=server_requests)
        self._supervisor = Supervisor(name, self._connect, self._announce_reconnect,
                                      Backoff(backoff_initial, backoff_max))

    @property
    def info(self) -> UpstreamInfo | None:
        return self._supervisor.info

    async def start(self, on_notification: NotificationHandler) -> UpstreamInfo:
        # Also after ``close`` (the pool retries a failed start on the same object): a stream that ends must make
        # the supervisor reconnect again, which ``_closed`` would prevent.
        self._closed = False
        self._rpc.on_notification = on_notification
        return await self._supervisor.start()

    def watch(self, listener: StateListener) -> None:
        """Hear when the connection is being re-established and when it is back (upstream health)."""
        self._supervisor.on_state = listener

    async def request(self, method: str, params: Mapping[str, Any] | None, *, timeout: float,
                      on_message: RelatedMessageHandler | None = None) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        await self._supervisor.ready(timeout)
        return await self._rpc.call(method, params, timeout=self._rpc.remaining(deadline), on_message=on_message,
                                    transmit=self._transmit, reported_timeout=timeout)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        await self._rpc.notify(method, params)

    def restart(self, reason: str) -> bool:
        """Drop a stream that is open but no longer delivers answers (health ``down``) and open a new one, with a
        new handshake, as when a stream ends. False when there is no live stream to replace."""
        stream = self._stream
        if stream is None or self._closed or not self._supervisor.connected:
            return False
        log.warning("upstream.restart", upstream=self.name, reason=reason)
        self._lose(f"unresponsive, restarted: {reason}", stream)
        return True

    async def close(self) -> None:
        self._closed = True
        await self._supervisor.aclose()
        self._endpoint = None
        await self._rpc.aclose()

    # -- connection ------------------------------------------------------------------------------------------

    async def _connect(self) -> UpstreamInfo:
        endpoint: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        stream = self._stream = self._rpc.spawn(self._listen(endpoint))
        try:
            try:
                async with asyncio.timeout(self._init_timeout):
                    self._endpoint = await endpoint
            except TimeoutError:
                raise UpstreamUnavailable(self.name, log_detail="no endpoint event") from None
            result = await self._rpc.call(INITIALIZE, initialize_params(__version__), timeout=self._init_timeout,
                                          on_message=None, transmit=self._transmit)
            info = parse_initialize_result(self.name, result)
            await self._rpc.notify(INITIALIZED)
        except BaseException:
            self._stream = None
            stream.cancel()
            raise
        return info

    async def _announce_reconnect(self) -> None:
        await self._rpc.on_notification(TOOLS_LIST_CHANGED, {})

    def _endpoint_url(self, data: str) -> str:
        url = urljoin(self._url, data.strip())
        if not same_origin(url, self._url):
            raise UpstreamUnavailable(self.name, log_detail=f"endpoint {url!r} is not same-origin; refused")
        return url

    async def _listen(self, endpoint: asyncio.Future[str]) -> None:
        detail = "SSE stream ended"
        try:
            with http_errors(self.name, "GET"):
                async with self._client.stream("GET", self._url, headers=self._get_headers,
                                               timeout=STREAM_TIMEOUT) as response:
                    if response.status_code != 200 or not is_event_stream(response):
                        raise UpstreamUnavailable(self.name, log_detail=f"SSE GET HTTP {response.status_code}")
                    async for event in sse_events(response, self.name, SseDecoder(self._max_message)):
                        if event.event == "endpoint" and not endpoint.done():
                            endpoint.set_result(self._endpoint_url(event.data))
                        elif event.event == "message" and event.data:
                            await self._dispatch(event.data)
        except UpstreamUnavailable as exc:
            detail = exc.log_detail or detail
            if not endpoint.done():
                endpoint.set_exception(exc)
        except Exception as exc:
            # Not the upstream's known failures but a defect: the stream is as gone, and must be reported so
            # (below), or the upstream would stay "connected" to a stream nobody reads, every request timing out.
            log.exception("upstream.stream_failed", upstream=self.name)
            detail = f"SSE stream failed: {type(exc).__name__}"
        if not endpoint.done():
            endpoint.set_exception(UpstreamUnavailable(self.name, log_detail=detail))
        if self._closed or self._stream is not asyncio.current_task():
            return
        self._lose(detail)

    def _lose(self, detail: str, stream: asyncio.Task[None] | None = None) -> None:
        """End the connection: requests in flight fail now, and the supervisor reconnects once ``stream`` (an open
        stream being dropped) is gone, so that the new server-side session never overlaps the old one."""
        self._stream = None
        self._endpoint = None
        self._rpc.fail_all(detail)
        self._supervisor.lost(detail, cleanup=None if stream is None else lambda: cancel_and_wait([stream]))

    async def _dispatch(self, data: str) -> None:
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._rpc.noisy(log.warning, "upstream.bad_json", upstream=self.name, size=len(data))
            return
        await self._rpc.handle(message)

    # -- sending ---------------------------------------------------------------------------------------------

    async def _transmit(self, pending: Pending) -> None:
        await self._post(pending.message)

    async def _post(self, message: dict[str, Any]) -> None:
        endpoint = self._endpoint
        if endpoint is None:
            raise UpstreamUnavailable(self.name, log_detail="not connected")
        with http_errors(self.name, "POST"):
            async with self._client.stream("POST", endpoint, content=orjson.dumps(message),
                                           headers=self._post_headers, timeout=STREAM_TIMEOUT) as response:
                # The answer comes on the SSE stream; this body (usually "Accepted") is read only to its limit.
                await read_body(response, self.name, self._max_message)
        if response.status_code >= 300:
            raise UpstreamUnavailable(self.name, log_detail=f"POST HTTP {response.status_code}")
