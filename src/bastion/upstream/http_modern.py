"""An upstream MCP server over Streamable HTTP in the 2026-07-28 (stateless) revision.

Every request is a self-contained POST: its ``_meta`` carries version, client capabilities and client info, and
headers mirror the body (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name``, ``Mcp-Param-*``). There is no
session, no GET stream and no DELETE. Closing a request's response stream is its cancellation, so a timeout or a
cancelled caller simply closes it. Notifications outside requests arrive on one long-lived
``subscriptions/listen`` request. ``detect`` is the dual-era probe: a ``server/discover`` whose answer (status and
body) says which era the server speaks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import orjson
import structlog

from bastion import __version__
from bastion.errors import HEADER_MISMATCH, UpstreamRpcError, UpstreamUnavailable
from bastion.protocol.methods import DISCOVER, LISTEN, TOOLS_CALL, TOOLS_LIST
from bastion.sse import SseDecoder
from bastion.upstream.base import NotificationHandler, RelatedMessageHandler, UpstreamInfo
from bastion.upstream.bodies import DEFAULT_MAX_MESSAGE_BYTES
from bastion.upstream.connections import H1Pool
from bastion.upstream.headers import request_headers
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
from bastion.upstream.modern import (
    MODERN_VERSION,
    Verdict,
    envelope,
    http_probe_verdict,
    offers_list_changes,
    parse_discover_result,
)
from bastion.upstream.modern_client import Listener, ModernCalls, listen_request
from bastion.upstream.session import DEFAULT_SERVER_REQUESTS, Pending, RpcSession, ServerRequests, StrayHandler
from bastion.upstream.supervisor import Backoff

__all__ = ["ModernHttpUpstream"]

log = structlog.get_logger("bastion.upstream")


async def _ignore(method: str, params: Mapping[str, Any]) -> None:
    return None


class ModernHttpUpstream(HttpPeer):
    def __init__(self, name: str, url: str, headers: Mapping[str, str], client: httpx.AsyncClient, *,
                 init_timeout: float = 30.0, listen: bool = True, backoff_initial: float = 0.5,
                 backoff_max: float = 30.0, fast: H1Pool | None = None, on_stray: StrayHandler | None = None,
                 server_requests: ServerRequests = DEFAULT_SERVER_REQUESTS,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        super().__init__(name, url, headers, client, init_timeout=init_timeout, listen=listen, fast=fast,
                         max_message_bytes=max_message_bytes)
        self._rpc = RpcSession(name, self._send, on_stray=on_stray, server_requests=server_requests)
        self._rpc.accept_server_requests = False
        self._rpc.cancel_by_notice = False
        self._calls = ModernCalls(name)
        self._listener = Listener(name, self._open_listen, lambda: self._rpc.on_notification,
                                  Backoff(backoff_initial, backoff_max))
        self._listening: asyncio.Task[None] | None = None

    async def detect(self) -> Verdict:
        """Probe with ``server/discover``. A modern answer is kept as this upstream's info. Connection failures
        raise ``UpstreamUnavailable``: an outage is never an era verdict."""
        pending = self._rpc.open(DISCOVER, envelope(None, __version__), None)
        try:
            async with asyncio.timeout(self._init_timeout):
                status, body = await self._probe(pending)
        except TimeoutError:
            raise UpstreamUnavailable(self.name, log_detail="server/discover probe timed out") from None
        finally:
            self._rpc.forget(pending)
        verdict = http_probe_verdict(status, body)
        log.info("upstream.era_detected", upstream=self.name, era=verdict, status=status)
        if verdict == "unsupported":
            raise UpstreamUnavailable(self.name, log_detail=f"probe answered HTTP {status}: {str(body)[:200]}")
        if verdict == "modern" and isinstance(body, Mapping) and isinstance(body.get("result"), Mapping):
            self._info = parse_discover_result(self.name, body["result"])
        return verdict

    async def start(self, on_notification: NotificationHandler) -> UpstreamInfo:
        # Also after ``close``: the pool retries a failed start on the same object, which must then act as new.
        self._closed = False
        self._rpc.on_notification = on_notification
        if self._info is None:
            result = await self._rpc.call(DISCOVER, envelope(None, __version__), timeout=self._init_timeout,
                                          on_message=None, transmit=self._transmit)
            self._info = parse_discover_result(self.name, result)
        log.info("upstream.discovered", upstream=self.name, version=self._info.protocol_version)
        if self._listen_enabled and self._listening is None and offers_list_changes(self._info.capabilities):
            self._listening = self._rpc.spawn(self._listener.run())
        return self._info

    async def request(self, method: str, params: Mapping[str, Any] | None, *, timeout: float,
                      on_message: RelatedMessageHandler | None = None) -> dict[str, Any]:
        if self._closed or self._info is None:
            raise UpstreamUnavailable(self.name, log_detail="not connected")
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            result = await self._rpc.call(method, self._calls.params(params), timeout=timeout, on_message=on_message,
                                          transmit=self._transmit)
        except UpstreamRpcError as exc:
            if exc.code != HEADER_MISMATCH or method != TOOLS_CALL:
                raise
            # The spec's remedy: our view of the tool's x-mcp-header arguments is stale; re-list, retry once, all
            # within the caller's one deadline.
            log.info("upstream.header_mismatch_retry", upstream=self.name)
            await self._relist_tools(deadline, timeout)
            result = await self._rpc.call(method, self._calls.params(params), timeout=self._rpc.remaining(deadline),
                                          on_message=on_message, transmit=self._transmit, reported_timeout=timeout)
        return self._calls.result(method, params, result)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        # The core revision defines no client-to-server notifications over HTTP (cancelling is closing a stream).
        log.debug("upstream.notification_dropped", upstream=self.name, method=method)

    def restart(self, reason: str) -> bool:
        """Nothing to replace: no session, no stream of its own but ``subscriptions/listen`` (which ``Listener``
        re-opens when it ends), and every request is a new exchange that reaches a server once it answers."""
        return False

    async def close(self) -> None:
        self._closed = True
        # Discovered again at the next start: the server that answers then may have changed.
        self._info = None
        self._calls = ModernCalls(self.name)
        await self._rpc.aclose()  # also ends the subscriptions/listen task
        self._listening = None
        self._listener.reset()

    # -- requests --------------------------------------------------------------------------------------------

    async def _relist_tools(self, deadline: float, timeout: float) -> None:
        cursor: Any = None
        for _ in range(100):
            params = {"cursor": cursor} if cursor is not None else None
            result = await self._rpc.call(TOOLS_LIST, self._calls.params(params),
                                          timeout=self._rpc.remaining(deadline), on_message=None,
                                          transmit=self._transmit, reported_timeout=timeout)
            self._calls.result(TOOLS_LIST, params, result)
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str):
                return

    def _headers_for(self, message: Mapping[str, Any]) -> dict[str, str]:
        method = str(message["method"])
        params = message.get("params")
        params = params if isinstance(params, Mapping) else None
        tool = params.get("name") if params is not None and method == TOOLS_CALL else None
        mirrored = request_headers(method, params, MODERN_VERSION,
                                   self._calls.tool_headers(tool) if isinstance(tool, str) else None)
        return {**self._base_headers, **mirrored, **trace_headers(message)}

    async def _probe(self, pending: Pending) -> tuple[int, Any]:
        with http_errors(self.name, "POST"):
            async with self._post(pending.message) as response:
                if is_event_stream(response):
                    async for event in sse_events(response, self.name, SseDecoder(self._max_message)):
                        if event.event == "message" and event.data:
                            message = orjson.loads(event.data)
                            if isinstance(message, dict) and message.get("id") == pending.id:
                                return response.status_code, message
                    return response.status_code, None
                body = await read_body(response, self.name, self._max_message)
        try:
            return response.status_code, orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            return response.status_code, None

    async def _transmit(self, pending: Pending) -> None:
        # Leaving this block closes the response; when that happens early (timeout, cancelled caller) it is the
        # request's cancellation.
        with http_errors(self.name, "POST"):
            async with self._post(pending.message) as response:
                if response.status_code >= 300:
                    await self._refused(response, pending)
                elif is_event_stream(response):
                    async for event in sse_events(response, self.name, SseDecoder(self._max_message)):
                        if event.event == "message" and event.data:
                            await self._rpc.handle(orjson.loads(event.data), related=pending)
                            if pending.future.done():
                                return
                else:
                    body = await read_body(response, self.name, self._max_message)
                    await self._rpc.handle(orjson.loads(body), related=pending)
        if not pending.future.done():
            raise UpstreamUnavailable(self.name, log_detail="response ended without an answer")

    def _post(self, message: Mapping[str, Any]) -> AbstractAsyncContextManager[ResponseLike]:
        body = orjson.dumps(message)
        headers = self._headers_for(message)
        if self._fast is not None and self._target is not None and message["method"] != LISTEN:
            return self._fast.post(self._target, headers, body)
        return self._client.stream("POST", self._url, content=body, headers={**headers, **HTTPX_HEADERS},
                                   timeout=STREAM_TIMEOUT)

    async def _refused(self, response: ResponseLike, pending: Pending) -> None:
        body = await read_body(response, self.name, self._max_message)
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            message = None
        # Modern servers answer protocol errors with 4xx and a JSON-RPC error body; that is the real answer.
        if isinstance(message, dict) and "error" in message and message.get("id") in (pending.id, None):
            await self._rpc.handle({**message, "id": pending.id}, related=pending)
            return
        raise UpstreamUnavailable(self.name, log_detail=f"HTTP {response.status_code}: {body[:200]!r}")

    async def _send(self, message: dict[str, Any]) -> None:
        # Only answers to server requests come here, and a modern client must not send responses.
        log.debug("upstream.message_not_sent", upstream=self.name, id=message.get("id"))

    async def _open_listen(self, handler: RelatedMessageHandler) -> dict[str, Any]:
        method, params = listen_request()
        return await self._rpc.call(method, params, timeout=None, on_message=handler, transmit=self._transmit)
