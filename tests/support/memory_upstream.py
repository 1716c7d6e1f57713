"""An MCP server in this process: a real implementation of the ``Upstream`` contract (``bastion.upstream.base``)
over Python data, for the in-process tests of the core (tests/core).

It is not a mock: it answers every method the gateway sends the way the fixture servers do over a transport
(paginated lists, tools/call, prompts/get, resources/read, subscriptions, ping, server/discover), keeps the
contract's error rules (``UpstreamRpcError`` for an error answer, ``UpstreamUnavailable`` before ``start`` or
while unreachable, ``UpstreamTimeout`` after ``timeout`` seconds), and records what a real server would see:
every request as received and every request it was told to cancel (a timeout, or the caller's task cancelled).

Behaviour a test needs beyond the defaults is scripted per method and target (a tool or prompt name, a URI):
a fixed result, an error to raise, a delay, or a handler of its own that may use the call's ``on_message``
(progress, sampling). The lists are plain attributes: change them and ``announce`` the ``list_changed``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from bastion.errors import UpstreamRpcError, UpstreamTimeout, UpstreamUnavailable
from bastion.upstream.base import NotificationHandler, RelatedMessageHandler, UpstreamEra, UpstreamInfo

# A scripted answer: receives the request's params and the call's related-message handler.
Handler = Callable[[dict[str, Any], RelatedMessageHandler | None], Awaitable[dict[str, Any]]]

LEGACY_VERSION = "2025-11-25"
MODERN_VERSION = "2026-07-28"
_LISTS = {"tools/list": ("tools", "tools"), "prompts/list": ("prompts", "prompts"),
          "resources/list": ("resources", "resources"),
          "resources/templates/list": ("templates", "resourceTemplates")}
# The params field that names what a request is about, for scripting per target.
_TARGET = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri", "resources/subscribe": "uri",
           "resources/unsubscribe": "uri"}


def tool(name: str, *, description: str | None = None, properties: Mapping[str, Any] | None = None,
         required: Sequence[str] = (), output: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A tool definition as an upstream lists it."""
    schema: dict[str, Any] = {"type": "object", "properties": dict(properties or {})}
    if required:
        schema["required"] = list(required)
    definition: dict[str, Any] = {"name": name, "inputSchema": schema, **extra}
    if description is not None:
        definition["description"] = description
    if output is not None:
        definition["outputSchema"] = dict(output)
    return definition


def text_result(text: str, **extra: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], **extra}


class MemoryUpstream:
    """One upstream MCP server, in memory. See the module docstring."""

    def __init__(self, name: str, *, tools: Sequence[Mapping[str, Any]] = (),
                 prompts: Sequence[Mapping[str, Any]] = (), resources: Sequence[Mapping[str, Any]] = (),
                 templates: Sequence[Mapping[str, Any]] = (), instructions: str | None = None,
                 era: UpstreamEra = "legacy", page_size: int | None = None) -> None:
        self.name = name
        self.tools: list[Mapping[str, Any]] = list(tools)
        self.prompts: list[Mapping[str, Any]] = list(prompts)
        self.resources: list[Mapping[str, Any]] = list(resources)
        self.templates: list[Mapping[str, Any]] = list(templates)
        self.instructions = instructions
        self.era: UpstreamEra = era
        # Lists are cut into pages of this size (cursor: the index of the next item), like a large real server.
        self.page_size = page_size
        # False: ``start`` and every request fail as an unreachable server does (a dead child, a refused socket).
        self.reachable = True
        # What this server saw: every request (method, params) in order, every one it was told to cancel, every
        # notification the gateway sent, the URIs it is subscribed to.
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[tuple[str, dict[str, Any]]] = []
        self.notified: list[tuple[str, dict[str, Any]]] = []
        self.subscriptions: set[str] = set()
        self.closed = False
        self._scripts: dict[tuple[str, str | None], Handler] = {}
        self._info: UpstreamInfo | None = None
        self._on_notification: NotificationHandler | None = None

    # -- scripting ------------------------------------------------------------------------------------------

    def script(self, method: str, target: str | None = None, *, result: Mapping[str, Any] | None = None,
               raises: Exception | None = None, delay: float = 0.0, handler: Handler | None = None) -> None:
        """Answer ``method`` (for ``target`` only, when given) after ``delay`` seconds with ``result``, by
        raising ``raises``, or by running ``handler``; otherwise the default answer after the delay."""

        async def scripted(params: dict[str, Any], on_message: RelatedMessageHandler | None) -> dict[str, Any]:
            if delay:
                await asyncio.sleep(delay)
            if raises is not None:
                raise raises
            if handler is not None:
                return await handler(params, on_message)
            if result is not None:
                return dict(result)
            return await self._default(method, params, on_message)

        self._scripts[(method, target)] = scripted

    async def announce(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """Send a notification outside any request (``notifications/tools/list_changed``, resource updates)."""
        assert self._on_notification is not None, "announce before start"
        await self._on_notification(method, dict(params or {}))

    def calls(self, method: str = "tools/call") -> list[dict[str, Any]]:
        """The params of every ``method`` request received, in order."""
        return [params for m, params in self.requests if m == method]

    # -- the Upstream contract ------------------------------------------------------------------------------

    @property
    def info(self) -> UpstreamInfo | None:
        return self._info

    async def start(self, on_notification: NotificationHandler) -> UpstreamInfo:
        if not self.reachable:
            raise UpstreamUnavailable(self.name, log_detail="memory upstream unreachable")
        self._on_notification = on_notification
        self.closed = False
        capabilities: dict[str, Any] = {"tools": {"listChanged": True}}
        if self.prompts:
            capabilities["prompts"] = {"listChanged": True}
        if self.resources or self.templates:
            capabilities["resources"] = {"listChanged": True, "subscribe": True}
        if any(method == "completion/complete" for method, _ in self._scripts):
            capabilities["completions"] = {}
        self._info = UpstreamInfo(era=self.era, protocol_version=MODERN_VERSION if self.era == "modern"
                                  else LEGACY_VERSION, capabilities=capabilities,
                                  server_info={"name": f"memory-{self.name}", "version": "1.0"},
                                  instructions=self.instructions)
        return self._info

    async def request(self, method: str, params: Mapping[str, Any] | None, *, timeout: float,
                      on_message: RelatedMessageHandler | None = None) -> dict[str, Any]:
        if self._info is None or not self.reachable:
            raise UpstreamUnavailable(self.name, log_detail="memory upstream not connected")
        received = json.loads(json.dumps(dict(params or {})))  # what a transport delivers: a copy, plain JSON
        self.requests.append((method, received))
        target = received.get(_TARGET.get(method, ""))
        scripted = self._scripts.get((method, target if isinstance(target, str) else None)) \
            or self._scripts.get((method, None))
        try:
            async with asyncio.timeout(timeout):
                if scripted is not None:
                    return await scripted(received, on_message)
                return await self._default(method, received, on_message)
        except TimeoutError:
            # The contract: the server is told to cancel, and the caller gets UpstreamTimeout.
            self.cancelled.append((method, received))
            raise UpstreamTimeout(self.name, timeout) from None
        except asyncio.CancelledError:
            self.cancelled.append((method, received))
            raise

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        self.notified.append((method, dict(params or {})))

    def restart(self, reason: str) -> bool:
        return False

    async def close(self) -> None:
        self.closed = True
        self._info = None

    # -- default answers ------------------------------------------------------------------------------------

    async def _default(self, method: str, params: dict[str, Any],
                       on_message: RelatedMessageHandler | None) -> dict[str, Any]:
        if method == "ping":
            return {}
        if method == "server/discover" and self.era == "modern":
            return {"supportedVersions": [MODERN_VERSION], "capabilities": dict(self._info.capabilities)
                    if self._info else {}}
        if method in _LISTS:
            attr, key = _LISTS[method]
            return self._page(getattr(self, attr), key, params.get("cursor"))
        if method == "tools/call":
            name = params.get("name")
            if not any(t.get("name") == name for t in self.tools):
                raise UpstreamRpcError(-32602, f"Unknown tool: {name}")
            return text_result(json.dumps(params.get("arguments", {}), sort_keys=True))
        if method == "prompts/get":
            name = params.get("name")
            if not any(p.get("name") == name for p in self.prompts):
                raise UpstreamRpcError(-32602, f"Unknown prompt: {name}")
            return {"messages": [{"role": "user", "content": {
                "type": "text", "text": f"prompt {name} with {json.dumps(params.get('arguments', {}))}"}}]}
        if method == "resources/read":
            uri = params.get("uri")
            if not isinstance(uri, str) or not self._serves(uri):
                raise UpstreamRpcError(-32002, f"Resource not found: {uri}", data={"uri": uri})
            return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": f"contents of {uri}"}]}
        if method in ("resources/subscribe", "resources/unsubscribe"):
            uri = str(params.get("uri"))
            if method == "resources/subscribe":
                self.subscriptions.add(uri)
            else:
                self.subscriptions.discard(uri)
            return {}
        raise UpstreamRpcError(-32601, f"Method not found: {method}")

    def _page(self, items: Sequence[Mapping[str, Any]], key: str, cursor: Any) -> dict[str, Any]:
        if self.page_size is None:
            return {key: [dict(i) for i in items]}
        try:
            start = int(cursor) if cursor is not None else 0
        except (TypeError, ValueError):
            raise UpstreamRpcError(-32602, f"Invalid cursor: {cursor!r}") from None
        end = start + self.page_size
        page: dict[str, Any] = {key: [dict(i) for i in items[start:end]]}
        if end < len(items):
            page["nextCursor"] = str(end)
        return page

    def _serves(self, uri: str) -> bool:
        if any(r.get("uri") == uri for r in self.resources):
            return True
        # A template serves every URI under its fixed head ("memo://notes/{id}" serves "memo://notes/7").
        return any(uri.startswith(str(t.get("uriTemplate", "")).split("{", 1)[0]) for t in self.templates
                   if "{" in str(t.get("uriTemplate", "")))
