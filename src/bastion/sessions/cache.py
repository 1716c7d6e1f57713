"""Sessions this replica just saw, trusted for a moment without asking Redis: no session round trip per request.

With Redis sessions and Redis limits every call cost two round trips: the session lookup (``GETEX``, which also
refreshes the idle TTL) and the limiter's script. A client sends its calls back to back on one session, so the
lookup nearly always re-reads what the previous call read. ``CachedSessionStore`` keeps the sessions Redis
confirmed recently and answers from that copy while the confirmation is younger than ``trust_s``; the touch that
keeps the session alive in Redis is written behind, for every session served from the copy, in one pipelined
round trip per ``touch_delay_s``. That round trip also confirms: it returns each session's current data (so an
update made through another replica arrives with it) and finds the sessions that are gone.

Semantics, against the uncached store:

- **Deleted through another replica**: refused here within ``trust_s`` at most (the copy is never trusted longer
  than that after the Redis command that last showed the session alive was *sent*), and usually within
  ``touch_delay_s`` when the session is in use (the write-behind touch finds it gone). Deleted through this
  replica: at once.
- **Updated through another replica** (``initialized``, the log level): seen here within the same bounds.
- **Idle timeout**: unchanged within ``touch_delay_s``: a request served from the copy refreshes the Redis TTL at
  most ``touch_delay_s`` later, so a session lives ``idle_timeout`` after its last request, plus that delay at
  most. ``trust_s`` is capped at half the idle timeout, so the copy can never outlive the Redis key.
- **Redis down**: the write-behind touch fails, the sessions it carried leave the copy, and the next request goes
  to the inner store (the fallback store, which serves the sessions this replica knows; see
  ``sessions.fallback``). The copy never answers for longer than ``trust_s`` after the inner store last answered.
- **Sweeps** (``bastion.sessions.sweep``) look at the Redis keys, which the touches keep alive as before.

The copy holds at most ``max_sessions`` entries, least recently used dropped first.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

import structlog

from bastion.sessions.store import SessionData, SessionStore

__all__ = ["DEFAULT_TOUCH_DELAY_S", "DEFAULT_TRUST_S", "CachedSessionStore", "ConfirmingStore"]

log = structlog.get_logger("bastion.server.sessions")

DEFAULT_TRUST_S = 1.0
DEFAULT_TOUCH_DELAY_S = 0.1


class ConfirmingStore(SessionStore, Protocol):
    async def confirm(self, session_ids: Collection[str]) -> dict[str, SessionData]:
        """Refresh the idle TTL of each session in one round trip; return the current data of those that exist.
        An id missing from the answer is gone, or not for the shortcut to decide (the next ``get`` decides)."""


@dataclass(slots=True)
class _Entry:
    data: SessionData
    confirmed: float  # when the Redis command that last showed this session alive was sent
    version: int = 0  # bumped by local updates, so an older confirmation never overwrites a newer update


class CachedSessionStore:
    """A ``SessionStore`` over ``inner`` that serves recently confirmed sessions without a round trip."""

    def __init__(self, inner: ConfirmingStore, *, idle_timeout_s: float, max_sessions: int,
                 trust_s: float = DEFAULT_TRUST_S, touch_delay_s: float = DEFAULT_TOUCH_DELAY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._inner = inner
        # Never longer than half the idle timeout: a confirmed key then still has at least that long to live.
        self.trust_s = min(trust_s, idle_timeout_s / 2)
        self.touch_delay_s = min(touch_delay_s, self.trust_s)
        self._max = max_sessions
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._touch: set[str] = set()
        self._flush: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._deletes = 0  # local deletes so far: a lookup that raced one must not re-cache the session
        self.hits = 0
        self.misses = 0

    async def get(self, session_id: str) -> SessionData | None:
        now = self._clock()
        entry = self._entries.get(session_id)
        if entry is not None and now - entry.confirmed < self.trust_s:
            self.hits += 1
            self._entries.move_to_end(session_id)
            self._touch.add(session_id)
            if self._flush is None and self._flushing is None:
                self._flush = asyncio.get_running_loop().call_later(self.touch_delay_s, self._start_flush)
            return entry.data
        self.misses += 1
        deletes = self._deletes
        data = await self._inner.get(session_id)  # GETEX: refreshes the TTL itself, no touch owed
        self._touch.discard(session_id)
        if data is None:
            self._entries.pop(session_id, None)
        elif deletes == self._deletes:
            self._remember(data, now)
        return data

    async def peek(self, session_id: str) -> SessionData | None:
        """The copy while it is trusted (no touch owed: a peek is not a use), else the inner store's answer."""
        entry = self._entries.get(session_id)
        if entry is not None and self._clock() - entry.confirmed < self.trust_s:
            return entry.data
        data = await self._inner.peek(session_id)
        if data is None:
            self._entries.pop(session_id, None)
            self._touch.discard(session_id)
        return data

    async def create(self, data: SessionData) -> None:
        sent = self._clock()
        await self._inner.create(data)
        self._remember(data, sent)

    async def update(self, data: SessionData) -> None:
        await self._inner.update(data)
        entry = self._entries.get(data.id)
        if entry is not None:
            # Not re-confirmed: SET XX was a no-op if the session ended elsewhere; the next touch will tell.
            entry.data = data
            entry.version += 1

    async def delete(self, session_id: str) -> bool:
        self._deletes += 1
        self._entries.pop(session_id, None)
        self._touch.discard(session_id)
        return await self._inner.delete(session_id)

    async def count(self) -> int:
        return await self._inner.count()

    async def aclose(self) -> None:
        """Write the pending touches (bounded by the inner store's timeout), then close the inner store."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        if self._touch:
            await self._confirm()
        closer = getattr(self._inner, "aclose", None)
        if closer is not None:
            await closer()

    # -- the write-behind touch -----------------------------------------------------------------------------

    def _start_flush(self) -> None:
        self._flush = None
        self._flushing = asyncio.get_running_loop().create_task(self._confirm(), name="bastion-session-touch")
        self._flushing.add_done_callback(self._flushed)

    def _flushed(self, task: asyncio.Task[None]) -> None:
        self._flushing = None
        if not task.cancelled() and task.exception() is not None:
            log.error("session_cache.touch_failed", error=type(task.exception()).__name__)
        if self._touch:  # served from the copy while this touch was in flight
            self._flush = asyncio.get_running_loop().call_later(self.touch_delay_s, self._start_flush)

    async def _confirm(self) -> None:
        ids, self._touch = self._touch, set()
        versions = {sid: e.version for sid in ids if (e := self._entries.get(sid)) is not None}
        sent = self._clock()
        try:
            found = await self._inner.confirm(versions)
        except Exception as exc:
            # Whatever went wrong, these sessions are no longer vouched for: their next request asks the inner
            # store, which knows how to serve an outage.
            log.debug("session_cache.confirm_failed", error=type(exc).__name__, sessions=len(versions))
            found = {}
        for sid, version in versions.items():
            entry = self._entries.get(sid)
            if entry is None:
                continue  # deleted here (or pushed out) meanwhile
            data = found.get(sid)
            if data is None:
                del self._entries[sid]  # gone from Redis: deleted or expired elsewhere
                continue
            entry.confirmed = sent
            if entry.version == version:
                entry.data = data

    # -- the copy -------------------------------------------------------------------------------------------

    def _remember(self, data: SessionData, confirmed: float) -> None:
        entry = self._entries.get(data.id)
        if entry is None:
            self._entries[data.id] = _Entry(data, confirmed)
        else:
            entry.data, entry.confirmed = data, confirmed
            entry.version += 1
        self._entries.move_to_end(data.id)
        while len(self._entries) > self._max:
            dropped, _ = self._entries.popitem(last=False)
            self._touch.discard(dropped)
