"""What both modern transports (stdio and HTTP) do around each request: the envelope on the way out, the
result checks and the tool catalogue filter on the way back, and the long-lived ``subscriptions/listen``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from bastion import __version__
from bastion.errors import METHOD_NOT_FOUND, RequestError, UpstreamRpcError
from bastion.protocol.headers import HeaderMap, header_map, invalid_header_reason
from bastion.protocol.meta import SUBSCRIPTION_ID_KEY
from bastion.protocol.methods import ACKNOWLEDGED, LIST_CHANGES, LISTEN, TOOLS_LIST
from bastion.upstream.base import NotificationHandler, RelatedMessageHandler
from bastion.upstream.modern import check_result, envelope, listen_params
from bastion.upstream.supervisor import Backoff

__all__ = ["LIST_CHANGES", "Listener", "ModernCalls"]

log = structlog.get_logger("bastion.upstream")


class ModernCalls:
    """Per-upstream request shaping for a 2026-07-28 server.

    It sees every ``tools/list`` result pass by, so it keeps each tool's ``x-mcp-header`` map (the HTTP
    transport mirrors annotated arguments from it) and drops tools whose annotations are invalid, as the spec
    requires of clients. Pages are collected from a first page (no cursor) to the last one and then replace
    the previous map, so a tool call during a refresh still finds its headers.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._headers: dict[str, HeaderMap] = {}
        self._collecting: dict[str, HeaderMap] | None = None

    def params(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        return envelope(params, __version__)

    def tool_headers(self, tool: str) -> HeaderMap | None:
        if self._collecting is not None and tool in self._collecting:
            return self._collecting[tool]
        return self._headers.get(tool)

    def result(self, method: str, params: Mapping[str, Any] | None, result: dict[str, Any]) -> dict[str, Any]:
        result = check_result(self.name, result)
        if method == TOOLS_LIST and result.get("resultType", "complete") == "complete":
            result = self._observe_tools(params, result)
        return result

    def _observe_tools(self, params: Mapping[str, Any] | None, result: dict[str, Any]) -> dict[str, Any]:
        tools = result.get("tools")
        if not isinstance(tools, list):
            return result
        if params is None or params.get("cursor") is None:
            self._collecting = {}
        elif self._collecting is None:
            self._collecting = dict(self._headers)
        kept: list[Any] = []
        for tool in tools:
            if not isinstance(tool, Mapping):
                kept.append(tool)
                continue
            schema = tool.get("inputSchema")
            reason = invalid_header_reason(schema)
            if reason is not None:
                log.warning("upstream.tool_dropped", upstream=self.name, tool=str(tool.get("name"))[:128],
                            reason=reason)
                continue
            kept.append(tool)
            mapping = header_map(schema)
            if mapping and isinstance(tool.get("name"), str):
                self._collecting[tool["name"]] = mapping
        if result.get("nextCursor") is None:
            self._headers, self._collecting = self._collecting, None
        if len(kept) == len(tools):
            return result
        return {**result, "tools": kept}


# Opens one listen request and returns when it ends; the handler gets the stream's notifications.
OpenListen = Callable[[RelatedMessageHandler], Awaitable[dict[str, Any]]]


class Listener:
    """One ``subscriptions/listen`` request per modern upstream, re-opened with backoff whenever it ends.

    Its list-change notifications go to ``on_notification``. After a re-open, changes may have been missed while
    no stream was open, so every list is announced as changed once the server acknowledges again.
    """

    def __init__(self, name: str, open_listen: OpenListen, on_notification: Callable[[], NotificationHandler],
                 backoff: Backoff) -> None:
        self.name = name
        self._open = open_listen
        self._on_notification = on_notification
        self._backoff = backoff
        self._opened = 0

    def reset(self) -> None:
        """Forget earlier streams: the next acknowledgement is a first one again (an upstream started afresh)."""
        self._opened = 0
        self._backoff.reset()

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self._open(self._handle)
                log.info("upstream.listen_ended", upstream=self.name)
            except UpstreamRpcError as exc:
                if exc.code == METHOD_NOT_FOUND:
                    log.info("upstream.no_listen", upstream=self.name)
                    return
                log.info("upstream.listen_failed", upstream=self.name, error=exc.message, detail=exc.log_detail)
            except RequestError as exc:
                log.info("upstream.listen_failed", upstream=self.name, error=exc.message, detail=exc.log_detail)
            self._backoff.connection_ended(time.monotonic() - started)
            await asyncio.sleep(self._backoff.next_delay())

    async def _handle(self, method: str, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        on_notification = self._on_notification()
        if method == ACKNOWLEDGED:
            self._opened += 1
            if self._opened > 1:
                for change in LIST_CHANGES:
                    await on_notification(change, {})
            return None
        if method in LIST_CHANGES:
            meta = params.get("_meta")
            if isinstance(meta, Mapping) and SUBSCRIPTION_ID_KEY in meta:
                rest = {k: v for k, v in meta.items() if k != SUBSCRIPTION_ID_KEY}
                params = {**params, "_meta": rest} if rest else {k: v for k, v in params.items() if k != "_meta"}
            await on_notification(method, params)
            return None
        log.debug("upstream.listen_ignored", upstream=self.name, method=method)
        return None


def listen_request() -> tuple[str, dict[str, Any]]:
    return LISTEN, envelope(listen_params(), __version__)
