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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson

from bastion.errors import HttpError

SESSION_ID_BYTES = 32


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


class MemorySessionStore:
    """One replica's sessions, expiring after ``idle_timeout_s`` without a request.

    ``on_expired`` hears of every session that expired (not deleted), so its end can be audited; expired entries
    are swept by ``sweep`` (the app calls it on a timer: ``sessions.sweep``), at most every ``sweep_every_s``
    on access, and whenever the table is full.
    """

    def __init__(self, idle_timeout_s: float, max_sessions: int, *,
                 on_expired: Callable[[SessionData], None] | None = None, sweep_every_s: float = 60.0) -> None:
        self._idle = idle_timeout_s
        self._max = max_sessions
        self._data: dict[str, tuple[SessionData, float]] = {}
        self._on_expired = on_expired
        self._sweep_every = sweep_every_s
        self._next_sweep = time.monotonic() + sweep_every_s

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + self._sweep_every
        expired = [sid for sid, (_, seen) in self._data.items() if now - seen > self._idle]
        for sid in expired:
            self._expire(sid)

    def _expire(self, session_id: str) -> None:
        data, _ = self._data.pop(session_id)
        if self._on_expired is not None:
            self._on_expired(data)

    async def create(self, data: SessionData) -> None:
        now = time.monotonic()
        if len(self._data) >= self._max or now >= self._next_sweep:
            self._sweep(now)
            if len(self._data) >= self._max:
                raise HttpError(503, "Too many sessions; try again later")
        self._data[data.id] = (data, now)

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
        return self._data.pop(session_id, None) is not None

    async def count(self) -> int:
        return len(self._data)

    async def sweep(self) -> int:
        """Expire every idle session now (each one reported to ``on_expired``); returns the sessions left."""
        self._sweep(time.monotonic())
        return len(self._data)

    def drain(self) -> list[SessionData]:
        """Forget every session (the process is shutting down) and return them, so their end can be recorded."""
        ended = [data for data, _ in self._data.values()]
        self._data.clear()
        return ended


def with_level(data: SessionData, level: str) -> SessionData:
    return replace(data, log_level=level)
