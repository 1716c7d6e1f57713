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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import orjson
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from bastion.sessions.redis_store import DEFAULT_KEY_PREFIX
from bastion.sessions.store import SessionData, SessionStore
from bastion.stopping import cancel_and_wait

__all__ = ["IndexedRedisSessions", "SessionSweeper", "SweptStore"]

log = structlog.get_logger("bastion.sessions")

_BATCH = 500


class SweptStore(SessionStore, Protocol):
    async def sweep(self) -> int:
        """Report every expired session to the store's ``on_expired``; return how many sessions are open."""

    def drain(self) -> list[SessionData]:
        """The sessions that end with this process (forgotten by the store)."""


class IndexedRedisSessions:
    """A Redis-backed ``SessionStore`` (``RedisSessionStore``, or the fallback store around it) plus the shared
    index that lets expiries be seen and claimed (module docstring)."""

    def __init__(self, store: SessionStore, redis: aioredis.Redis, *,
                 on_expired: Callable[[SessionData], None], key_prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self._store = store
        self._redis = redis
        self._prefix = key_prefix
        self._index = key_prefix.rstrip(":") + "-index"
        self._on_expired = on_expired

    async def create(self, data: SessionData) -> None:
        await self._store.create(data)
        try:
            await self._redis.hset(self._index, data.id, data.to_json())
        except (RedisError, OSError, RuntimeError) as exc:  # RuntimeError: see redis_store._call
            # The session works without its index entry; only its expiry would go unrecorded.
            log.warning("session_index_unavailable", op="add", error=type(exc).__name__)

    async def get(self, session_id: str) -> SessionData | None:
        return await self._store.get(session_id)

    async def peek(self, session_id: str) -> SessionData | None:
        return await self._store.peek(session_id)

    async def update(self, data: SessionData) -> None:
        await self._store.update(data)

    async def delete(self, session_id: str) -> bool:
        # Index first: a sweep in between sees the key still there, so it never reports this session as expired.
        try:
            await self._redis.hdel(self._index, session_id)
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
            try:
                data = SessionData.from_json(entries[sid])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                data = SessionData(id=sid, principal_id="", protocol_version="")
            self._on_expired(data)
        return len(ids) - len(gone)


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
