"""This replica's live part of a session: the GET stream's queue, in-flight calls, requests bastion sent to the client.

It exists only on the replica holding the connection and is never persisted or shared; the durable part
(``SessionData``) lives in a ``SessionStore`` (``bastion.sessions.store``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bastion.jsonrpc import RequestId
from bastion.principal import Principal

if TYPE_CHECKING:
    from bastion.backlog import Outbox


class InflightCall:
    """A request running on this replica, which its client may cancel (``notifications/cancelled``, ``DELETE`` of
    the session, closing a 2026-07-28 stream).

    ``cancel`` marks the cancellation as the client's before cancelling the task, so the request can tell it from
    any other (a shutdown) and answer instead of propagating it.
    """

    __slots__ = ("by_client", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.by_client = False

    def cancel(self) -> None:
        if not self.by_client:
            self.by_client = True
            self.task.cancel()


@dataclass(slots=True)
class LiveSession:
    """This replica's runtime state for a session: never persisted, never shared."""

    id: str
    # The GET stream's queue, bounded (``bastion.backlog``): every producer offers to it, none can grow it.
    get_stream: Outbox | None = None
    # Keyed by JSON-RPC ids (``jsonrpc.as_request_id``): the client's for its requests, bastion's for its own.
    inflight: dict[RequestId, InflightCall] = field(default_factory=dict)
    pending: dict[RequestId, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    subscriptions: set[str] = field(default_factory=set)  # public resource URIs
    last_seen: float = 0.0
    # Who holds the GET stream, and the log floor it asked for (``logging/setLevel``): for relaying upstream log
    # messages that belong to no call (``bastion.server.log_relay``).
    principal: Principal | None = None
    log_level: str | None = None

    @property
    def busy(self) -> bool:
        return bool(self.inflight or self.pending or self.get_stream is not None)


class LiveSessions:
    """Live state per session on this replica, forgotten once a session has been idle past the store's timeout.

    Clients often just go away without DELETE; without the sweep every such session would stay here forever.
    """

    def __init__(self, idle_timeout_s: float = 3600.0, sweep_every_s: float = 60.0) -> None:
        self._live: dict[str, LiveSession] = {}
        self._idle = idle_timeout_s
        self._sweep_every = sweep_every_s
        self._next_sweep = time.monotonic() + sweep_every_s

    def get(self, session_id: str) -> LiveSession:
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        live = self._live.get(session_id)
        if live is None:
            live = self._live[session_id] = LiveSession(session_id)
        live.last_seen = now
        return live

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + self._sweep_every
        stale = [sid for sid, live in self._live.items() if not live.busy and now - live.last_seen >= self._idle]
        for sid in stale:
            del self._live[sid]

    def drop(self, session_id: str) -> None:
        """The client ended the session (``DELETE``): what runs on it is cancelled as the client's cancellation,
        and its live state ends (``end``)."""
        live = self._live.get(session_id)
        if live is not None:
            for call in live.inflight.values():
                call.cancel()
        self.end(session_id)

    def end(self, session_id: str) -> None:
        """The session ended, whichever way (deleted, expired, evicted, found gone by its stream): its GET stream
        closes, its subscriptions and log floor go, so nothing is sent for it any more, and the requests bastion
        sent its client are abandoned (the answer could only come within the session). Calls already running
        finish on their own POST streams: each was authorised when it started and is bounded by its timeout."""
        live = self._live.pop(session_id, None)
        if live is None:
            return
        live.subscriptions.clear()
        live.log_level = None
        for fut in live.pending.values():
            if not fut.done():
                fut.cancel()
        if live.get_stream is not None:
            live.get_stream.put_nowait(None)  # wakes the GET stream so it can end

    def all(self) -> list[LiveSession]:
        return list(self._live.values())
