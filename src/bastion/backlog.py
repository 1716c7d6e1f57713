"""The one queue between upstream traffic and a client's stream, bounded, whoever produces into it.

Every message bastion pushes to a client waits in an ``Outbox`` until that client's stream writes it: a call's SSE
response (``server.responder``; its upstream's progress, log messages and sampling or elicitation requests) and a
session's GET stream (``server.lifecycle``; resource updates, list changes, log messages outside calls). The rate
at which they arrive is the upstream's; the rate at which they leave is the client's. A client that stops reading
must not make bastion hold an upstream's traffic without limit, so the bound is here, in the queue, and not in
each producer, where a new producer would have to remember it:

- up to ``bound`` messages are queued as they come (``listen.client_backlog``, default ``DEFAULT_BACKLOG``: an
  operator trades memory held per slow client against how large a burst one absorbs before dropping, with
  ``bastion_relay_dropped_total`` to tell which side needs it);
- past it a notification is *coalesced* when a queued one says the same thing older (the latest progress of a
  token, an update of the same resource URI, the same list changed: the queued one is replaced in place by the
  newer one, so the client still gets the newest value), otherwise *dropped*. Drops leave one marker in the
  queue, a ``notifications/message`` (``level: warning``, ``logger: bastion``) saying how many of each kind the
  client missed. Both are counted (``on_drop``: ``bastion_relay_dropped_total{queue,kind}``);
- what cannot be dropped goes in regardless: a call's result and end, and bastion's own requests to the client,
  which ``server.emitter`` caps per call (``MAX_ASKS_IN_FLIGHT``, ``MAX_ASKS_PER_CALL``) instead;
- ``close`` is for a writer that is gone: the queue is emptied and takes nothing more, and the requests waiting
  on it for the client's answer fail at once (a handshake-era call runs on after its client hung up, and must not
  keep feeding a queue nobody drains).

A queue holds at most ``bound`` messages plus one marker plus the capped requests and the call's result.
Building one costs a few attribute stores: one is made for every ``tools/call`` from a client that accepts SSE,
and most calls never put anything in it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from bastion.protocol.methods import LOG_MESSAGE, PROGRESS, RESOURCE_UPDATED

__all__ = ["CALL_BACKLOG", "DEFAULT_BACKLOG", "KINDS", "MAX_BACKLOG", "STREAM_BACKLOG", "DropHook", "Outbox",
           "kind_of"]

# Messages a stream (a call's response stream, a session's GET stream) holds for a client that does not read it,
# unless ``listen.client_backlog`` says otherwise; and the most that setting accepts (each message may be up to an
# upstream's max_message_size before the sanitizer cuts it).
DEFAULT_BACKLOG = 256
MAX_BACKLOG = 65_536
CALL_BACKLOG = DEFAULT_BACKLOG
STREAM_BACKLOG = DEFAULT_BACKLOG

# (queue, kind): one message was coalesced or dropped. ``queue`` is ``call`` or ``session``; ``kind`` one of KINDS.
DropHook = Callable[[str, str], None]
KINDS = ("progress", "log", "resource_updated", "list_changed", "request", "other")


def kind_of(method: Any) -> str:
    """The metric's ``kind`` for a message's method: a closed set, whatever an upstream sends."""
    if method == PROGRESS:
        return "progress"
    if method == LOG_MESSAGE:
        return "log"
    if method == RESOURCE_UPDATED:
        return "resource_updated"
    if isinstance(method, str) and method.startswith("notifications/") and method.endswith("/list_changed"):
        return "list_changed"
    return "other"


def _supersedes(message: dict[str, Any]) -> tuple[str, Any] | None:
    """What a newer message of the same key makes stale, or None when nothing can replace it."""
    method = message.get("method")
    params = message.get("params")
    if method == PROGRESS:
        token = params.get("progressToken") if isinstance(params, dict) else None
        return (method, token) if isinstance(token, (str, int)) else None
    if method == RESOURCE_UPDATED:
        uri = params.get("uri") if isinstance(params, dict) else None
        return (method, uri) if isinstance(uri, str) else None
    if isinstance(method, str) and method.endswith("/list_changed"):
        return (method, None)
    return None


def _ignore(queue: str, kind: str) -> None:
    return None


class _Latest:
    """A coalescible message in the queue; a newer one with its key replaces ``message``."""

    __slots__ = ("key", "message")

    def __init__(self, key: tuple[str, Any], message: dict[str, Any]) -> None:
        self.key = key
        self.message = message


class _Marker:
    """Where messages were dropped: becomes one log message with the counts when the client reads it."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def message(self) -> dict[str, Any]:
        total = sum(self.counts.values())
        return {"jsonrpc": "2.0", "method": LOG_MESSAGE, "params": {
            "level": "warning", "logger": "bastion",
            "data": {"message": f"bastion dropped {total} message(s) this client did not read in time",
                     "dropped": dict(self.counts)}}}


class Outbox:
    """The messages for one client stream, in order; ``None`` ends them. See the module."""

    __slots__ = ("_bound", "_index", "_items", "_marker", "_on_drop", "_queue", "_waiter", "asked", "asks",
                 "closed", "on_first")

    def __init__(self, on_drop: DropHook | None = None, *, bound: int = CALL_BACKLOG, queue: str = "call") -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # Queued coalescible messages by key; made at the first one (most calls send none).
        self._index: dict[tuple[str, Any], _Latest] | None = None
        self._marker: _Marker | None = None
        self._bound = bound
        self._queue = queue
        self._on_drop = on_drop or _ignore
        self.on_first: Callable[[], None] | None = None
        self.closed = False
        # bastion's own requests to the client waiting on this stream (``server.emitter``), and how many were sent.
        self.asks: set[asyncio.Future[dict[str, Any]]] | None = None
        self.asked = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bound(self) -> int:
        return self._bound

    def qsize(self) -> int:
        return len(self._items)

    def put_nowait(self, item: dict[str, Any] | None) -> None:
        """What cannot be dropped: a result, the end (``None``), a request bastion caps itself."""
        if not self.closed:
            self._append(item)

    def offer(self, message: dict[str, Any]) -> bool:
        """A notification: queued under the bound; past it coalesced or dropped (and counted). False: not queued as
        itself (coalesced, dropped, or the writer is gone)."""
        if self.closed:
            return False
        key = _supersedes(message)
        if len(self._items) < self._bound:
            if key is None:
                self._append(message)
            else:
                latest = _Latest(key, message)
                index = self._index
                if index is None:
                    index = self._index = {}
                index[key] = latest
                self._append(latest)
            return True
        kind = kind_of(message.get("method"))
        queued = self._index.get(key) if key is not None and self._index is not None else None
        if queued is not None:
            queued.message = message  # the newer value, where the older one waits
        else:
            marker = self._marker
            if marker is None or not self._items or self._items[-1] is not marker:
                marker = self._marker = _Marker()
                self._append(marker)
            marker.counts[kind] = marker.counts.get(kind, 0) + 1
        self._on_drop(self._queue, kind)
        return False

    def dropped(self, kind: str) -> None:
        """Count a message refused before it reached the queue (a request over the per-call cap)."""
        self._on_drop(self._queue, kind)

    def _append(self, item: Any) -> None:
        self._items.append(item)
        first = self.on_first
        if first is not None:
            self.on_first = None
            first()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> dict[str, Any] | None:
        items = self._items
        while not items:
            if self.closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if type(item) is _Latest:
            index = self._index
            if index is not None and index.get(item.key) is item:
                del index[item.key]
            return item.message
        if type(item) is _Marker:
            if self._marker is item:
                self._marker = None
            return item.message()
        return item  # type: ignore[no-any-return]

    def close(self, reason: Exception) -> None:
        """The writer is gone: nothing more is queued, what waits is freed, and requests waiting for the client's
        answer fail with ``reason`` now instead of at their timeout."""
        self.closed = True
        self.on_first = None
        self._items.clear()
        self._index = None
        self._marker = None
        self.fail_asks(reason)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail_asks(self, reason: Exception) -> None:
        """The call is over (or its stream is gone): its requests to the client stop waiting for an answer."""
        asks, self.asks = self.asks, None
        for fut in asks or ():
            if not fut.done():
                fut.set_exception(reason)
