"""Handshake-era sessions (revisions up to 2025-11-25).

A session is what ``initialize`` negotiated (protocol version, client capabilities, client info) bound to the
principal that opened it. It is never a credential: every request is authenticated on its own, and a session id
presented by another principal is answered exactly like an unknown one (404), so ids cannot be probed.

The durable part (``SessionData``) lives in a ``SessionStore``: in memory for one replica, in Redis when Redis is
configured so any replica can serve any session. The live part (the GET stream's queue, in-flight calls,
requests bastion sent to the client) exists only on the replica holding the connection, in ``LiveSession``
(``bastion.sessions.live``).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson
import structlog

from bastion.errors import HttpError

SESSION_ID_BYTES = 32

log = structlog.get_logger("bastion.sessions")


@dataclass(frozen=True, slots=True)
class SessionData:
    id: str
    principal_id: str
    protocol_version: str
    client_capabilities: Mapping[str, Any] = field(default_factory=dict)
    client_info: Mapping[str, Any] = field(default_factory=dict)
    log_level: str | None = None
    initialized: bool = False
    created_at: float = 0.0

    def to_json(self) -> bytes:
        return orjson.dumps({
            "id": self.id, "principal_id": self.principal_id, "protocol_version": self.protocol_version,
            "client_capabilities": self.client_capabilities, "client_info": self.client_info,
            "log_level": self.log_level, "initialized": self.initialized, "created_at": self.created_at,
        })

    @classmethod
    def from_json(cls, raw: bytes | str) -> SessionData:
        d = orjson.loads(raw)
        return cls(id=d["id"], principal_id=d["principal_id"], protocol_version=d["protocol_version"],
                   client_capabilities=d.get("client_capabilities") or {}, client_info=d.get("client_info") or {},
                   log_level=d.get("log_level"), initialized=bool(d.get("initialized")),
                   created_at=float(d.get("created_at", 0.0)))


def new_session_id() -> str:
    # 256 bits from the OS CSPRNG, URL-safe base64: visible ASCII only, as the transport spec requires.
    return secrets.token_urlsafe(SESSION_ID_BYTES)


class SessionStore(Protocol):
    async def create(self, data: SessionData) -> None: ...

    async def get(self, session_id: str) -> SessionData | None: ...

    async def peek(self, session_id: str) -> SessionData | None:
        """The session if it is still open, without counting as a use (the idle timeout is not refreshed): for a
        GET stream re-checking that its session has not ended elsewhere."""

    async def update(self, data: SessionData) -> None: ...

    async def delete(self, session_id: str) -> bool: ...

    async def count(self) -> int: ...


# Called with a session the store ended on its own (idle expiry, eviction); must not block or raise.
SessionEnded = Callable[[SessionData], None]


class MemorySessionStore:
    """One replica's sessions, expiring after ``idle_timeout_s`` without a request.

    ``on_expired`` hears of every session that expired (not deleted), so its end can be audited; expired entries
    are swept by ``sweep`` (the app calls it on a timer: ``sessions.sweep``), at most every ``sweep_every_s``
    on access, and whenever the table is full.

    Capacity is shared fairly (``sessions.max_per_principal``): a principal holds at most ``max_per_principal``
    sessions; its next ``initialize`` ends its own least recently used one, reported to ``on_evicted``. When the
    whole table is full, the least recently used session of the principal holding the most is ended instead,
    as long as that principal would still hold more than the caller; only when every principal holds about as
    many as the caller is ``initialize`` refused (503). So one principal can never use up the capacity another
    needs: a client that leaks sessions only ends its own.
    """

    def __init__(self, idle_timeout_s: float, max_sessions: int, *, max_per_principal: int | None = None,
                 on_expired: SessionEnded | None = None, on_evicted: SessionEnded | None = None,
                 sweep_every_s: float = 60.0) -> None:
        self._idle = idle_timeout_s
        self._max = max_sessions
        self._per_principal = max_per_principal if max_per_principal is not None else max_sessions
        self._data: dict[str, tuple[SessionData, float]] = {}
        # Each principal's session ids, least recently used first.
        self._by_principal: dict[str, OrderedDict[str, None]] = {}
        self._on_expired = on_expired
        self._on_evicted = on_evicted
        self._sweep_every = sweep_every_s
        self._next_sweep = time.monotonic() + sweep_every_s

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + self._sweep_every
        expired = [sid for sid, (_, seen) in self._data.items() if now - seen > self._idle]
        for sid in expired:
            self._expire(sid)

    def _remove(self, session_id: str) -> SessionData | None:
        entry = self._data.pop(session_id, None)
        if entry is None:
            return None
        owned = self._by_principal.get(entry[0].principal_id)
        if owned is not None:
            owned.pop(session_id, None)
            if not owned:
                del self._by_principal[entry[0].principal_id]
        return entry[0]

    def _expire(self, session_id: str) -> None:
        data = self._remove(session_id)
        if data is not None and self._on_expired is not None:
            self._on_expired(data)

    def _evict_oldest_of(self, principal_id: str) -> None:
        """End the least recently used session of ``principal_id``."""
        owned = self._by_principal[principal_id]
        data = self._remove(next(iter(owned)))
        log.warning("session.evicted", session=data.id[:8] if data else None, principal=principal_id,
                    max_per_principal=self._per_principal)
        if data is not None and self._on_evicted is not None:
            self._on_evicted(data)

    async def create(self, data: SessionData) -> None:
        now = time.monotonic()
        if len(self._data) >= self._max or now >= self._next_sweep:
            self._sweep(now)
        owned = self._by_principal.get(data.principal_id)
        while owned and len(owned) >= self._per_principal:
            self._evict_oldest_of(data.principal_id)
            owned = self._by_principal.get(data.principal_id)
        if len(self._data) >= self._max:
            # Full: take the seat of the principal holding the most, if it would still hold more than the caller.
            mine = len(owned) if owned else 0
            heaviest = max(self._by_principal, key=lambda p: len(self._by_principal[p]))
            if len(self._by_principal[heaviest]) <= mine + 1:
                raise HttpError(503, "Too many sessions; try again later")
            self._evict_oldest_of(heaviest)
        self._data[data.id] = (data, now)
        self._by_principal.setdefault(data.principal_id, OrderedDict())[data.id] = None

    async def get(self, session_id: str) -> SessionData | None:
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        entry = self._data.get(session_id)
        if entry is None:
            return None
        if now - entry[1] > self._idle:
            self._expire(session_id)
            return None
        self._data[session_id] = (entry[0], now)
        self._by_principal[entry[0].principal_id].move_to_end(session_id)
        return entry[0]

    async def peek(self, session_id: str) -> SessionData | None:
        entry = self._data.get(session_id)
        if entry is None:
            return None
        if time.monotonic() - entry[1] > self._idle:
            self._expire(session_id)
            return None
        return entry[0]

    async def update(self, data: SessionData) -> None:
        if data.id in self._data:
            self._data[data.id] = (data, time.monotonic())

    async def delete(self, session_id: str) -> bool:
        return self._remove(session_id) is not None

    async def count(self) -> int:
        return len(self._data)

    def held_by(self, principal_id: str) -> int:
        """How many open sessions ``principal_id`` holds here."""
        return len(self._by_principal.get(principal_id, ()))

    async def sweep(self) -> int:
        """Expire every idle session now (each one reported to ``on_expired``); returns the sessions left."""
        self._sweep(time.monotonic())
        return len(self._data)

    def drain(self) -> list[SessionData]:
        """Forget every session (the process is shutting down) and return them, so their end can be recorded."""
        ended = [data for data, _ in self._data.values()]
        self._data.clear()
        self._by_principal.clear()
        return ended


def with_level(data: SessionData, level: str) -> SessionData:
    return replace(data, log_level=level)
