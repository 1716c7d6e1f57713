"""Handshake-era sessions in Redis, so any replica can serve any session.

One string key per session (``<prefix><id>`` holding ``SessionData.to_json()``) with a TTL equal to the idle
timeout. Every successful ``get`` refreshes the TTL in the same command (``GETEX``), so "idle" means "no request
on any replica" and expiry needs no sweeper. The principal binding travels inside the data; the front door
compares it with the caller and answers a mismatch like an unknown id.

Redis being down must not look like "no such session" (a client would then re-initialize in a loop against a
store that cannot hold the new session either), so every Redis failure becomes a 503 the client can retry.
Every operation is bounded by ``timeout_s``, so a frozen Redis costs a request at most that long. The gateway wraps
this store in ``FallbackSessionStore``, which serves the sessions this replica has seen while Redis is down.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

import orjson
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from bastion.deadlines import Deadlines
from bastion.errors import HttpError
from bastion.sessions.store import SessionData

log = structlog.get_logger("bastion.server.redis_sessions")

T = TypeVar("T")

DEFAULT_KEY_PREFIX = "bastion:session:"
# Ids bastion issues are 43 URL-safe base64 characters. Anything else cannot be a session of ours, so it is
# answered as unknown without a round trip, and an attacker cannot make bastion touch arbitrary keys.
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_SCAN_BATCH = 500


class SessionStoreUnavailable(HttpError):
    """Redis could not be reached or answered with an error: the request may be retried."""

    def __init__(self, *, log_detail: str | None = None) -> None:
        super().__init__(503, "Session store unavailable; try again later", headers={"Retry-After": "1"},
                         log_detail=log_detail)


class RedisSessionStore:
    """A ``SessionStore`` shared by every replica that uses the same Redis and key prefix."""

    def __init__(self, redis: aioredis.Redis, *, idle_timeout_s: float,
                 key_prefix: str = DEFAULT_KEY_PREFIX, timeout_s: float = 1.0) -> None:
        if idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be positive")
        self._redis = redis
        self._timeout_s = timeout_s
        self._deadlines = Deadlines()
        # Millisecond TTLs, at least 1 ms: Redis rejects PX 0.
        self._ttl_ms = max(1, int(idle_timeout_s * 1000))
        self._prefix = key_prefix
        # Not under the prefix: no session id can name it, and SCAN of the sessions does not count it.
        self._epoch_key = key_prefix.rstrip(":") + "-epoch"

    def _key(self, session_id: str) -> str:
        return self._prefix + session_id

    async def _call(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            with self._deadlines.after(self._timeout_s):
                return await fn()
        except TimeoutError:
            # A frozen Redis: the socket timeout plus the client's retry could exceed the request's budget.
            raise SessionStoreUnavailable(
                log_detail=f"redis {op} did not answer within {self._timeout_s:g} s") from None
        except (RedisError, OSError, RuntimeError) as exc:
            # RuntimeError: redis-py (8.1) can write to an asyncio transport it closed itself when a Sentinel
            # failover drops the connection under load ("unable to perform operation on <TCPTransport
            # closed=True>"); for a caller that is the same outage as a refused connection.
            detail = f"redis {op} failed: {type(exc).__name__}: {exc}"
            # Debug only: the fallback store logs each outage once, not every request that met it.
            log.debug("session_store_unavailable", op=op, error=type(exc).__name__)
            raise SessionStoreUnavailable(log_detail=detail) from None

    async def ping(self) -> None:
        """One round trip to Redis, bounded like every other operation; raises ``SessionStoreUnavailable``."""
        await self._call("ping", lambda: self._redis.ping())

    async def create(self, data: SessionData) -> None:
        if not _SESSION_ID.match(data.id):
            raise ValueError("session ids must be URL-safe base64 (see new_session_id)")
        payload = data.to_json()
        # NX: a 256-bit random id never collides; if it somehow did, refusing beats handing one client another's
        # session.
        created = await self._call("create", lambda: self._redis.set(self._key(data.id), payload, nx=True,
                                                                      px=self._ttl_ms))
        if not created:
            # The client retries a command whose connection died before the reply: the key may hold our own write.
            existing = await self._call("create", lambda: self._redis.get(self._key(data.id)))
            if existing != payload:
                raise HttpError(503, "Could not create a session; try again", log_detail="session id collision")

    async def get(self, session_id: str) -> SessionData | None:
        if not _SESSION_ID.match(session_id):
            return None
        raw = await self._call("get", lambda: self._redis.getex(self._key(session_id), px=self._ttl_ms))
        if raw is None:
            return None
        try:
            return SessionData.from_json(raw)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            # A value bastion did not write (or an older, incompatible format): the session is unusable, so it
            # is treated as expired and removed, and the client re-initializes.
            log.warning("session_record_unreadable", session=session_id[:8])
            await self._call("delete", lambda: self._redis.delete(self._key(session_id)))
            return None

    async def peek(self, session_id: str) -> SessionData | None:
        """``GET``: the session if its key exists, without refreshing its idle TTL (a re-check is not a use)."""
        if not _SESSION_ID.match(session_id):
            return None
        raw = await self._call("peek", lambda: self._redis.get(self._key(session_id)))
        if raw is None:
            return None
        try:
            return SessionData.from_json(raw)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None  # the next get removes it

    async def confirm(self, session_ids: Collection[str]) -> dict[str, SessionData]:
        """The write-behind touch of ``CachedSessionStore``: ``GETEX`` for every id in one pipelined round trip,
        refreshing each TTL as ``get`` would. Returns the sessions that exist; an unreadable one is left out (its
        next ``get`` removes it)."""
        ids = [sid for sid in session_ids if _SESSION_ID.match(sid)]
        if not ids:
            return {}

        async def touch_all() -> list[bytes | None]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for sid in ids:
                    pipe.getex(self._key(sid), px=self._ttl_ms)
                return list(await pipe.execute())

        raws = await self._call("confirm", touch_all)
        found: dict[str, SessionData] = {}
        for sid, raw in zip(ids, raws, strict=True):
            if raw is None:
                continue
            try:
                found[sid] = SessionData.from_json(raw)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
        return found

    async def update(self, data: SessionData) -> None:
        if not _SESSION_ID.match(data.id):
            return
        payload = data.to_json()
        # XX: an update never resurrects a session that expired or was deleted on another replica meanwhile.
        await self._call("update", lambda: self._redis.set(self._key(data.id), payload, xx=True, px=self._ttl_ms))

    async def delete(self, session_id: str) -> bool:
        if not _SESSION_ID.match(session_id):
            return False
        removed = await self._call("delete", lambda: self._redis.delete(self._key(session_id)))
        return bool(removed)

    async def epoch(self) -> str:
        """A random marker this Redis keeps outside the session namespace, created on first use. It changes only
        when Redis lost its data (a restart without persistence, a flush): the fallback store then knows that a
        missing session was lost, not deleted."""
        marker = secrets.token_hex(8)
        # SET NX GET: the existing marker, or None when ours was just stored (Redis >= 7.0).
        old = await self._call("epoch", lambda: self._redis.set(self._epoch_key, marker, nx=True, get=True))
        return marker if old is None else old.decode() if isinstance(old, bytes) else str(old)

    async def count(self) -> int:
        """Live sessions across all replicas. O(keys in the database): meant for metrics and admin, not requests."""
        async def scan() -> int:
            total = 0
            async for _ in self._redis.scan_iter(match=_escape_glob(self._prefix) + "*", count=_SCAN_BATCH):
                total += 1
            return total

        return await self._call("count", scan)


def _escape_glob(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
