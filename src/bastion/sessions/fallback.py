"""Sessions that outlive a Redis outage on the replica that knows them.

Without this, a Redis outage ends every handshake-era session at once: each request's session lookup answers 503 before
any guard runs, so even ``rate_limits.failure_mode: open`` serves nobody. ``FallbackSessionStore`` wraps the Redis
store (still the authority whenever it answers) with a bounded local copy of the sessions this replica has seen:

==================  ===================================  =========================================================
operation           Redis answers                        Redis down (error or no answer within the store timeout)
==================  ===================================  =========================================================
get                 Redis's answer; the local copy is    the local copy if this replica saw the session within
                    refreshed (or dropped on ``None``)   ``idle_timeout``; otherwise 503 (never invented)
create              written to Redis, copied locally     kept locally, written to Redis once it answers
update              written to Redis (and locally)       kept locally, written to Redis once it answers
delete              deleted in Redis and locally         deleted locally, deleted in Redis once it answers
count               Redis's count                        503
==================  ===================================  =========================================================

The security trade-off, stated for operators: while Redis is down a replica keeps serving the sessions it saw,
including one deleted through another replica during the outage (or since this replica last saw it). A session is
never a credential (every request is authenticated, and the session stays bound to its principal), so the cost is
that a client may keep using a session it or another replica ended, on this replica, until Redis is back. A
session id this replica never saw is never accepted, so ids cannot be guessed into existence by an outage.

A Redis that comes back *empty* (restarted without persistence, or flushed) is recognised by an epoch marker it
keeps (``RedisSessionStore.epoch``): the sessions this replica has seen are then written back to it instead of
ending with a 404, with the same trade-off as above (one deleted through another replica just before the loss may
come back).

Pending writes (created, updated or deleted while Redis was down) are replayed in the background on the first
operation Redis answers after the outage; a session created here during the outage is also written back when its
next request finds Redis without it. The local copy holds at most ``max_sessions`` entries (least recently used
dropped first); a pending entry pushed out is lost, and its client re-initializes.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

import structlog

from bastion.errors import HttpError
from bastion.sessions.redis_store import RedisSessionStore, SessionStoreUnavailable
from bastion.sessions.store import SessionData

log = structlog.get_logger("bastion.server.sessions")

FallbackEvent = Literal["served_local", "refused", "created_local", "updated_local", "deleted_local", "synced",
                        "unavailable", "recovered"]
# Called with each event; must not block or raise. ``unavailable``/``recovered`` mark an outage's ends.
FallbackHook = Callable[[FallbackEvent], None]
_Pending = Literal["create", "update"]


@dataclass(slots=True)
class _Local:
    data: SessionData
    seen: float
    pending: _Pending | None = None
    # The store's write-back count when this session's own write-back landed (0: never written back).
    written_back: int = 0


class FallbackSessionStore:
    """A ``SessionStore`` over ``inner`` (the Redis one) that serves this replica's sessions while it is down."""

    def __init__(self, inner: RedisSessionStore, *, idle_timeout_s: float, max_sessions: int,
                 on_event: FallbackHook | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._inner = inner
        self._idle = idle_timeout_s
        self._max = max_sessions
        self._on_event = on_event
        self._clock = clock
        self._local: OrderedDict[str, _Local] = OrderedDict()
        self._deleted: set[str] = set()  # deleted here while Redis was down
        self._down_since: float | None = None
        self._outage_counts: dict[str, int] = {}
        self._sync: asyncio.Task[None] | None = None
        self._epoch: str | None = None
        self._reseeds = 0  # how many times Redis was found to have lost its data
        self._write_backs = 0  # how many sessions this store has written back to Redis
        # Something awaits replay: a flag, so the per-request success path never scans the local copy.
        self._dirty = False

    @property
    def available(self) -> bool:
        """False from the first failed Redis operation until the next one that succeeds."""
        return self._down_since is None

    async def get(self, session_id: str) -> SessionData | None:
        reseeds, write_backs = self._reseeds, self._write_backs
        try:
            data = await self._inner.get(session_id)
        except SessionStoreUnavailable as exc:
            self._down("get", exc)
            if session_id in self._deleted:
                return None
            local = self._fresh(session_id)
            if local is None:
                self._event("refused")
                raise
            local.seen = self._clock()
            self._local.move_to_end(session_id)
            self._event("served_local")
            return local.data
        self._up()
        if session_id in self._deleted:
            return None  # deleted here during the outage; the replay deletes it in Redis too
        if data is not None:
            local = self._local.get(session_id)
            if local is not None and local.pending is not None:
                return local.data  # changed here during the outage: newer than Redis's copy until the replay
            self._remember(data, None)
            await self._learn_epoch()
            return data
        local = self._fresh(session_id)
        if local is None:
            return None
        if local.pending != "create" and reseeds == self._reseeds and await self._redis_lost_data():
            self._reseed()
        if local.pending == "create" or reseeds != self._reseeds or local.written_back > write_backs:
            # Redis never had this session (created here during the outage) or lost it (a reseed happened since
            # this lookup started, possibly already writing it back), or this "no such session" was read before
            # the session's write-back landed (sent after a reseed, answered before the replay wrote it, seen
            # after): this replica's copy stands.
            if local.pending == "create":
                try:
                    await self._write_back(session_id)
                except SessionStoreUnavailable as exc:
                    self._down("create", exc)
            local.seen = self._clock()
            return local.data
        self._local.pop(session_id, None)  # Redis kept its data: the session was deleted or expired elsewhere
        return None

    async def peek(self, session_id: str) -> SessionData | None:
        """Redis's answer; while Redis is down, the local copy (a stream is not ended by an outage), else 503."""
        try:
            data = await self._inner.peek(session_id)
        except SessionStoreUnavailable as exc:
            self._down("peek", exc)
            if session_id in self._deleted:
                return None
            local = self._fresh(session_id)
            if local is None:
                raise
            return local.data
        self._up()
        if session_id in self._deleted:
            return None
        local = self._local.get(session_id)
        if data is None and local is not None and local.pending == "create":
            return local.data  # created here during the outage, not yet written back
        return data

    async def measure(self) -> bool:
        """Whether Redis answers the session store now, found by one real operation (a PING) that moves this
        store's outage state like any other: a failure starts an outage (``unavailable``), a success after one
        ends it (``recovered``). At start-up it is what the ``sessions`` health gauge starts from."""
        try:
            await self._inner.ping()
        except SessionStoreUnavailable as exc:
            self._down("ping", exc)
            return False
        self._up()
        return True

    async def create(self, data: SessionData) -> None:
        try:
            await self._inner.create(data)
        except SessionStoreUnavailable as exc:
            self._down("create", exc)
            self._remember(data, "create")
            self._event("created_local")
            return
        self._up()
        self._remember(data, None)
        await self._learn_epoch()

    async def update(self, data: SessionData) -> None:
        try:
            await self._inner.update(data)
        except SessionStoreUnavailable as exc:
            self._down("update", exc)
            previous = self._local.get(data.id)
            self._remember(data, "create" if previous is not None and previous.pending == "create" else "update")
            self._event("updated_local")
            return
        self._up()
        if data.id in self._local:
            self._remember(data, None)

    async def delete(self, session_id: str) -> bool:
        local = self._local.pop(session_id, None)
        try:
            removed = await self._inner.delete(session_id)
        except SessionStoreUnavailable as exc:
            self._down("delete", exc)
            if local is None:
                raise
            if local.pending != "create":
                self._deleted.add(session_id)  # Redis may hold it: delete it there once Redis answers
                self._dirty = True
            self._event("deleted_local")
            return True
        self._up()
        return removed or local is not None

    async def count(self) -> int:
        return await self._inner.count()

    async def confirm(self, session_ids: Collection[str]) -> dict[str, SessionData]:
        """Redis's ``confirm``, minus every session whose answer this store's ``get`` would have to work out
        (deleted or changed here during an outage, missing from Redis): the caller then asks ``get``. While Redis
        is down, nothing is confirmed."""
        try:
            found = await self._inner.confirm(session_ids)
        except SessionStoreUnavailable as exc:
            self._down("confirm", exc)
            return {}
        self._up()
        confirmed: dict[str, SessionData] = {}
        for sid, data in found.items():
            if sid in self._deleted:
                continue
            local = self._local.get(sid)
            if local is not None and local.pending is not None:
                continue
            self._remember(data, None)  # seen now, as a get would have: the outage copy stays current
            confirmed[sid] = data
        return confirmed

    async def aclose(self) -> None:
        """Give a running replay a moment to finish (each of its operations is bounded by the store timeout)."""
        if self._sync is not None:
            await asyncio.gather(self._sync, return_exceptions=True)

    # -- local copy -----------------------------------------------------------------------------------------

    def _fresh(self, session_id: str) -> _Local | None:
        local = self._local.get(session_id)
        if local is None or session_id in self._deleted:
            return None
        if self._clock() - local.seen > self._idle:
            # Redis would have expired it by now; so does the local copy.
            del self._local[session_id]
            return None
        return local

    def _remember(self, data: SessionData, pending: _Pending | None) -> None:
        self._deleted.discard(data.id)
        previous = self._local.get(data.id)
        self._local[data.id] = _Local(data, self._clock(), pending, previous.written_back if previous else 0)
        self._dirty = self._dirty or pending is not None
        self._local.move_to_end(data.id)
        while len(self._local) > self._max:
            dropped_id, dropped = self._local.popitem(last=False)
            if dropped.pending is not None:
                log.warning("session_store.local_dropped", session=dropped_id[:8], pending=dropped.pending)

    # -- Redis that lost its data --------------------------------------------------------------------------

    async def _learn_epoch(self) -> None:
        """Remember Redis's epoch marker once (one round trip per process), to recognise a later data loss."""
        if self._epoch is None:
            try:
                self._epoch = await self._inner.epoch()
            except SessionStoreUnavailable as exc:
                self._down("epoch", exc)

    async def _redis_lost_data(self) -> bool:
        """A session this replica saw is missing from Redis: deleted elsewhere, or lost with Redis's data?"""
        if self._epoch is None:
            return False
        try:
            epoch = await self._inner.epoch()
        except SessionStoreUnavailable as exc:
            self._down("epoch", exc)
            return False
        lost, self._epoch = epoch != self._epoch, epoch
        return lost

    def _reseed(self) -> None:
        """Redis came back empty (no persistence): give it back every live session this replica knows."""
        now = self._clock()
        fresh = [local for local in self._local.values() if now - local.seen <= self._idle]
        for local in fresh:
            local.pending = "create"  # an update would be a no-op on the missing key (SET XX)
        self._reseeds += 1
        self._dirty = True
        log.warning("session_store.reseeded", sessions=len(fresh),
                    detail="Redis lost its data (restart without persistence or flush); writing back the sessions "
                           "this replica has seen")
        self._up()

    # -- outage bookkeeping ---------------------------------------------------------------------------------

    def _event(self, event: FallbackEvent) -> None:
        if self._down_since is not None:
            self._outage_counts[event] = self._outage_counts.get(event, 0) + 1
        if self._on_event is not None:
            self._on_event(event)

    def _down(self, op: str, exc: SessionStoreUnavailable) -> None:
        if self._down_since is not None:
            return
        self._down_since = self._clock()
        self._outage_counts = {}
        log.warning("session_store.unavailable", op=op, detail=exc.log_detail,
                    local_sessions=len(self._local),
                    behaviour="sessions seen on this replica are served from memory; others get 503")
        self._event("unavailable")

    def _up(self) -> None:
        if self._down_since is not None:
            counts, self._outage_counts = self._outage_counts, {}
            log.info("session_store.recovered", outage_s=round(self._clock() - self._down_since, 3),
                     to_sync=self._pending_count(), **counts)
            self._down_since = None
            self._event("recovered")
        if self._dirty and (self._sync is None or self._sync.done()):
            self._sync = asyncio.get_running_loop().create_task(self._replay(), name="bastion-session-replay")

    def _pending_count(self) -> int:
        return len(self._deleted) + sum(1 for local in self._local.values() if local.pending is not None)

    async def _replay(self) -> None:
        """Write what changed here during the outage; stops at the first failure (the next success resumes)."""
        self._dirty = False
        try:
            for session_id in list(self._deleted):
                await self._inner.delete(session_id)
                self._deleted.discard(session_id)
                self._event("synced")
            for session_id in [sid for sid, local in self._local.items() if local.pending is not None]:
                await self._write_back(session_id)
        except SessionStoreUnavailable as exc:
            self._dirty = True
            self._down("replay", exc)

    async def _write_back(self, session_id: str) -> None:
        local = self._local.get(session_id)
        if local is None or local.pending is None:
            return
        pending, data = local.pending, local.data
        if pending == "create":
            try:
                await self._inner.create(data)
            except SessionStoreUnavailable:
                raise
            except HttpError:
                pass  # Redis already holds another value under this id (written by the client's next request)
        else:
            await self._inner.update(data)
        current = self._local.get(session_id)
        if current is not None and current.data is data:
            current.pending = None
            self._write_backs += 1
            current.written_back = self._write_backs
        self._event("synced")
