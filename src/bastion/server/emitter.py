"""How messages reach a client in the middle of a request: on that request's SSE stream, or nowhere.

A request answered with ``application/json`` has no channel for anything but its response, so its emitter drops
notifications and refuses server-to-client requests. A ``tools/call`` from a client that accepts SSE gets a
``StreamEmitter`` instead, and its response turns into an SSE stream when the first message comes
(``server/responder.py``). Its queue is bounded (``bastion.backlog``); so are its requests to the client, and
they wait no longer than the call: its end, or its stream's, fails them at once.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Protocol

from bastion import jsonrpc
from bastion.backlog import Outbox
from bastion.errors import INTERNAL_ERROR, METHOD_NOT_FOUND, RATE_LIMITED, ProtocolError
from bastion.sessions.live import LiveSession

__all__ = ["MAX_ASKS_IN_FLIGHT", "MAX_ASKS_PER_CALL", "Emitter", "NullEmitter", "Outbox", "StreamEmitter"]

# bastion's requests to one call's client (sampling, elicitation: each may cost the client model tokens or a
# person's attention) waiting for an answer at once, and sent in all, per call. Past either, the upstream's
# request is refused at once with -31001; the messages queue bounds the rest (``bastion.backlog``).
MAX_ASKS_IN_FLIGHT = 4
MAX_ASKS_PER_CALL = 64


class Emitter(Protocol):
    async def notify(self, method: str, params: dict[str, Any]) -> None: ...

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]: ...


class NullEmitter:
    async def notify(self, method: str, params: dict[str, Any]) -> None:
        return None

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        raise ProtocolError(METHOD_NOT_FOUND, f"the client cannot receive {method} on this request")


class StreamEmitter:
    """Puts messages in one response stream's outbox; client answers come back through the live session."""

    def __init__(self, outbox: Outbox, live: LiveSession | None, ids: itertools.count[int]) -> None:
        self.outbox = outbox
        self._live = live
        self._ids = ids

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        self.outbox.offer(jsonrpc.notification(method, params))

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        """Ask the call's client; refused at once past the per-call caps, and failed at once when the call or its
        stream ends (``Outbox.fail_asks``), whatever is left of ``timeout``."""
        if self._live is None:
            raise ProtocolError(METHOD_NOT_FOUND, f"the client cannot receive {method} on this request")
        outbox = self.outbox
        if outbox.closed:
            raise ProtocolError(INTERNAL_ERROR, f"the client's stream is gone; {method} not relayed")
        asks = outbox.asks
        if asks is None:
            asks = outbox.asks = set()
        if len(asks) >= MAX_ASKS_IN_FLIGHT or outbox.asked >= MAX_ASKS_PER_CALL:
            outbox.dropped("request")
            raise ProtocolError(RATE_LIMITED, f"too many {method} requests in this call: bastion relays at most "
                                f"{MAX_ASKS_IN_FLIGHT} at once and {MAX_ASKS_PER_CALL} per call")
        outbox.asked += 1
        # Ids bastion uses towards the client are its own, so they can never collide with ids the client picked.
        rid = f"bastion-{next(self._ids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._live.pending[rid] = fut
        asks.add(fut)
        try:
            outbox.put_nowait(jsonrpc.request(rid, method, params))
            async with asyncio.timeout(timeout):
                answer = await fut
        except TimeoutError:
            raise ProtocolError(INTERNAL_ERROR, f"the client did not answer {method} in time") from None
        finally:
            self._live.pending.pop(rid, None)
            asks.discard(fut)
        if "error" in answer:
            err = jsonrpc.read_error(answer["error"], "client error")
            raise ProtocolError(err.code, err.message, data=err.data)
        res = answer.get("result")
        return res if isinstance(res, dict) else {}
