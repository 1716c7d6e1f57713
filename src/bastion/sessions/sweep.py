"""Sessions end visibly: expiry is noticed on a timer, not only when someone happens to touch the session.

``SessionSweeper`` runs the store's ``sweep`` every ``sessions.sweep_interval``, sets the active-sessions gauge
from what is left, and at shutdown records the end of every session that dies with this process.

With Redis, keys expire silently inside Redis, and any replica may be the one serving a session, or none (the
replica that opened it may be gone). ``IndexedRedisSessions`` therefore keeps a shared index next to the
sessions: one hash field per open session holding its start data. Every replica's sweep looks for indexed
sessions whose key is gone, and claims each one with ``HDEL``: only the replica whose ``HDEL`` removed the field
reports the expiry, so each expired session gets exactly one ``session.end``, whichever replicas are alive. A
DELETE removes the field before the key, so a sweep can never mistake a deleted session for an expired one.
Redis-backed sessions outlive a replica's shutdown (another replica serves them), so shutdown ends none of them.

The same layer bounds what one principal may hold, across replicas (``sessions.max_per_principal``): a sorted set
per principal (``<prefix>-principal:<principal id>``) lists its open sessions, each scored by when its key would
expire. ``create`` adds the new session to it and reads its size in the round trip that writes the index entry, so
a create within the quota costs what it did, and requests on existing sessions never touch these sets. Past the
quota, the creator brings the scores up to date from each listed key's remaining TTL (``PTTL``, one pipelined round
trip; every use refreshes that TTL, so the lowest score is the least recently used), drops the members whose key
is gone, and pops the excess atomically (``ZPOPMIN`` in a one-key script): however many replicas create at once,
exactly the sessions beyond the quota are ended, each once, reported as evicted by the replica whose ``HDEL``
removed its index field (as for expiries). The sweep and ``delete`` remove the sessions they end from their
principal's set, so a set disappears with its last session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import orjson
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from bastion.errors import HttpError
from bastion.sessions.redis_store import DEFAULT_KEY_PREFIX
from bastion.sessions.store import SessionData, SessionStore
from bastion.stopping import cancel_and_wait

__all__ = ["IndexedRedisSessions", "SessionSweeper", "SweptStore"]

log = structlog.get_logger("bastion.sessions")

_BATCH = 500

# One key (Cluster-safe): pop the lowest-scored members beyond the quota ARGV[1].
_POP_EXCESS = """
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if excess <= 0 then return {} end
return redis.call('ZPOPMIN', KEYS[1], excess)
"""


def _now_ms() -> int:
    return int(time.time() * 1000)


class SweptStore(SessionStore, Protocol):
    async def sweep(self) -> int:
        """Report every expired session to the store's ``on_expired``; return how many sessions are open."""

    def drain(self) -> list[SessionData]:
        """The sessions that end with this process (forgotten by the store)."""


class IndexedRedisSessions:
    """A Redis-backed ``SessionStore`` (``RedisSessionStore``, or the fallback store around it) plus the shared
    index that lets expiries be seen and claimed (module docstring)."""

    def __init__(self, store: SessionStore, redis: aioredis.Redis, *,
                 on_expired: Callable[[SessionData], None], key_prefix: str = DEFAULT_KEY_PREFIX,
                 max_per_principal: int | None = None, idle_timeout_s: float = 3600.0,
                 on_evicted: Callable[[SessionData], None] | None = None) -> None:
        self._store = store
        self._redis = redis
        self._prefix = key_prefix
        self._index = key_prefix.rstrip(":") + "-index"
        self._owned_prefix = key_prefix.rstrip(":") + "-principal:"
        self._on_expired = on_expired
        self._per_principal = max_per_principal
        self._on_evicted = on_evicted
        self._ttl_ms = max(1, int(idle_timeout_s * 1000))
        self._pop_excess = redis.register_script(_POP_EXCESS)

    def _owned(self, principal_id: str) -> str:
        return self._owned_prefix + principal_id

    async def create(self, data: SessionData) -> None:
        await self._store.create(data)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hset(self._index, data.id, data.to_json())
                if self._per_principal is not None:
                    # Scored by when the session's key would expire: later use, higher score.
                    pipe.zadd(self._owned(data.principal_id), {data.id: _now_ms() + self._ttl_ms}, nx=True)
                    pipe.zcard(self._owned(data.principal_id))
                answers = await pipe.execute()
            if self._per_principal is not None and int(answers[2]) > self._per_principal:
                await self._evict(data.principal_id, data.id)
        except (RedisError, OSError, RuntimeError, HttpError) as exc:  # RuntimeError: see redis_store._call
            # The session works without its index entry; only its expiry (or its principal's quota) would go
            # unrecorded.
            log.warning("session_index_unavailable", op="add", error=type(exc).__name__)

    async def _evict(self, principal_id: str, new_id: str) -> None:
        """End ``principal_id``'s least recently used sessions beyond the quota (module docstring); ``new_id``,
        just created, is its most recent use."""
        assert self._per_principal is not None
        owned = self._owned(principal_id)
        members = [m.decode() if isinstance(m, bytes) else str(m) for m in await self._redis.zrange(owned, 0, -1)]
        async with self._redis.pipeline(transaction=False) as pipe:
            for sid in members:
                pipe.pttl(self._prefix + sid)
            ttls = await pipe.execute()
        now = _now_ms()
        stale = [sid for sid, ttl in zip(members, ttls, strict=True) if ttl == -2]
        # Each use refreshed the key's TTL: now + PTTL is when it would expire, i.e. its last use plus the idle
        # timeout. GT: a concurrent refresh with a later use is never undone; XX: a removed member stays removed.
        used = {sid: now + ttl for sid, ttl in zip(members, ttls, strict=True) if ttl >= 0}
        if new_id in used:
            used[new_id] = now + self._ttl_ms + 1  # above a session used in the same millisecond
        async with self._redis.pipeline(transaction=False) as pipe:
            if stale:
                pipe.zrem(owned, *stale)
            if used:
                pipe.zadd(owned, used, xx=True, gt=True)
            await pipe.execute()
        # Atomic in Redis: however many replicas create at once, exactly the excess is popped, each member once.
        victims = await self._pop_excess(keys=[owned], args=[self._per_principal])
        for raw_sid in victims[::2]:  # ZPOPMIN answers member, score, member, score, ...
            sid = raw_sid.decode() if isinstance(raw_sid, bytes) else str(raw_sid)
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hget(self._index, sid)
                pipe.hdel(self._index, sid)
                raw, claimed = await pipe.execute()
            await self._store.delete(sid)
            if not claimed:
                continue  # deleted or found expired meanwhile: that end is reported by whoever claimed it
            log.warning("session.evicted", session=sid[:8], principal=principal_id,
                        max_per_principal=self._per_principal)
            if self._on_evicted is not None:
                self._on_evicted(_parse(sid, raw, principal_id))

    async def get(self, session_id: str) -> SessionData | None:
        return await self._store.get(session_id)

    async def peek(self, session_id: str) -> SessionData | None:
        return await self._store.peek(session_id)

    async def update(self, data: SessionData) -> None:
        await self._store.update(data)

    async def delete(self, session_id: str) -> bool:
        # Index first: a sweep in between sees the key still there, so it never reports this session as expired.
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hget(self._index, session_id)
                pipe.hdel(self._index, session_id)
                raw, _ = await pipe.execute()
            if raw is not None and self._per_principal is not None:
                await self._redis.zrem(self._owned(_parse(session_id, raw, "").principal_id), session_id)
        except (RedisError, OSError, RuntimeError) as exc:  # RuntimeError: see redis_store._call
            log.warning("session_index_unavailable", op="remove", error=type(exc).__name__)
        return await self._store.delete(session_id)

    async def count(self) -> int:
        return await self._store.count()

    def drain(self) -> list[SessionData]:
        return []

    async def aclose(self) -> None:
        """Let the wrapped stores finish their background writes (touches, replays), each bounded by its timeout."""
        closer = getattr(self._store, "aclose", None)
        if closer is not None:
            await closer()

    async def sweep(self) -> int:
        entries: dict[str, bytes] = {}
        async for field, raw in self._redis.hscan_iter(self._index, count=_BATCH):
            entries[field.decode() if isinstance(field, bytes) else str(field)] = raw
        ids = list(entries)
        gone: list[str] = []
        for start in range(0, len(ids), _BATCH):
            batch = ids[start:start + _BATCH]
            pipe = self._redis.pipeline(transaction=False)
            for sid in batch:
                pipe.exists(self._prefix + sid)
            gone += [sid for sid, exists in zip(batch, await pipe.execute(), strict=True) if not exists]
        for sid in gone:
            if not await self._redis.hdel(self._index, sid):
                continue  # another replica claimed it (or a DELETE got there first)
            data = _parse(sid, entries[sid], "")
            if self._per_principal is not None and data.principal_id:
                await self._redis.zrem(self._owned(data.principal_id), sid)
            self._on_expired(data)
        return len(ids) - len(gone)


def _parse(session_id: str, raw: bytes | None, principal_id: str) -> SessionData:
    """An index entry's session; when it is unreadable, what is known of it."""
    if raw is not None:
        try:
            return SessionData.from_json(raw)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            pass
    return SessionData(id=session_id, principal_id=principal_id, protocol_version="")


class SessionSweeper:
    def __init__(self, store: SweptStore, interval_s: float, *, on_count: Callable[[int], None],
                 on_shutdown: Callable[[SessionData], Awaitable[None]]) -> None:
        self._store = store
        self._interval = interval_s
        self._on_count = on_count
        self._on_shutdown = on_shutdown
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="bastion-session-sweeper")

    async def sweep_once(self) -> None:
        try:
            left = await self._store.sweep()
        except (RedisError, OSError, RuntimeError) as exc:  # RuntimeError: see redis_store._call
            log.warning("session_sweep_failed", error=type(exc).__name__)
            return
        self._on_count(left)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.sweep_once()
            except Exception:
                log.exception("session_sweep_failed")

    async def close(self) -> None:
        """Stop sweeping and record the end of every session that dies with this process."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        ended = self._store.drain()
        for data in ended:
            await self._on_shutdown(data)
        if ended:
            log.info("sessions.ended_at_shutdown", count=len(ended))
