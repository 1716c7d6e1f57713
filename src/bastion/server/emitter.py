"""How messages reach a client in the middle of a request: on that request's SSE stream, or nowhere.

A request answered with ``application/json`` has no channel for anything but its response, so its emitter drops
notifications and refuses server-to-client requests. A ``tools/call`` from a client that accepts SSE gets a
``StreamEmitter`` instead, and its response turns into an SSE stream when the first message comes
(``server/responder.py``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from bastion import jsonrpc
from bastion.errors import INTERNAL_ERROR, METHOD_NOT_FOUND, ProtocolError
from bastion.sessions.live import LiveSession


class Emitter(Protocol):
    async def notify(self, method: str, params: dict[str, Any]) -> None: ...

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]: ...


class NullEmitter:
    async def notify(self, method: str, params: dict[str, Any]) -> None:
        return None

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        raise ProtocolError(METHOD_NOT_FOUND, f"the client cannot receive {method} on this request")


class Outbox:
    """The messages of one call for its response stream, in order; ``None`` ends them.

    An unbounded ``asyncio.Queue`` with only what the call path uses: one is made for every ``tools/call`` from a
    client that accepts SSE, and most calls put nothing in it, so building it must cost little (no locks, no
    future until somebody waits on an empty box). ``on_first``, when set, runs once, at the first message put:
    that is when the call's response has to become a stream (``server/responder.py``).
    """

    __slots__ = ("_items", "_waiter", "on_first")

    def __init__(self) -> None:
        self._items: deque[dict[str, Any] | None] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.on_first: Callable[[], None] | None = None

    def put_nowait(self, item: dict[str, Any] | None) -> None:
        self._items.append(item)
        first = self.on_first
        if first is not None:
            self.on_first = None
            first()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> dict[str, Any] | None:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class StreamEmitter:
    """Puts messages in one response stream's outbox; client answers come back through the live session."""

    def __init__(self, outbox: Outbox, live: LiveSession | None, ids: itertools.count[int]) -> None:
        self.outbox = outbox
        self._live = live
        self._ids = ids

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        self.outbox.put_nowait(jsonrpc.notification(method, params))

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        if self._live is None:
            raise ProtocolError(METHOD_NOT_FOUND, f"the client cannot receive {method} on this request")
        # Ids bastion uses towards the client are its own, so they can never collide with ids the client picked.
        rid = f"bastion-{next(self._ids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._live.pending[rid] = fut
        try:
            self.outbox.put_nowait(jsonrpc.request(rid, method, params))
            async with asyncio.timeout(timeout):
                answer = await fut
        except TimeoutError:
            raise ProtocolError(INTERNAL_ERROR, f"the client did not answer {method} in time") from None
        finally:
            self._live.pending.pop(rid, None)
        if "error" in answer:
            err = answer["error"] if isinstance(answer["error"], dict) else {}
            raise ProtocolError(int(err.get("code", INTERNAL_ERROR)), str(err.get("message", "client error")),
                                data=err.get("data") if isinstance(err.get("data"), dict) else None)
        res = answer.get("result")
        return res if isinstance(res, dict) else {}
