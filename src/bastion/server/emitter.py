"""How messages reach a client in the middle of a request: on that request's SSE stream, or nowhere.

A request answered with ``application/json`` has no channel for anything but its response, so its emitter drops
notifications and refuses server-to-client requests. A ``tools/call`` from a client that accepts SSE gets a
``StreamEmitter`` instead, and its response turns into an SSE stream when the first message comes
(``server/responder.py``).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Protocol

from bastion import jsonrpc
from bastion.errors import INTERNAL_ERROR, METHOD_NOT_FOUND, ProtocolError
from bastion.server.sessions import LiveSession


class Emitter(Protocol):
    async def notify(self, method: str, params: dict[str, Any]) -> None: ...

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]: ...


class NullEmitter:
    async def notify(self, method: str, params: dict[str, Any]) -> None:
        return None

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        raise ProtocolError(METHOD_NOT_FOUND, f"the client cannot receive {method} on this request")


class StreamEmitter:
    """Puts messages on one response stream's queue; client answers come back through the live session."""

    def __init__(self, queue: asyncio.Queue[dict[str, Any] | None], live: LiveSession | None,
                 ids: itertools.count[int]) -> None:
        self._queue = queue
        self._live = live
        self._ids = ids

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._queue.put(jsonrpc.notification(method, params))

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        if self._live is None:
            raise ProtocolError(METHOD_NOT_FOUND, f"the client cannot receive {method} on this request")
        # Ids bastion uses towards the client are its own, so they can never collide with ids the client picked.
        rid = f"bastion-{next(self._ids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._live.pending[rid] = fut
        try:
            await self._queue.put(jsonrpc.request(rid, method, params))
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
