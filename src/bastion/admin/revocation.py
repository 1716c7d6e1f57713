"""Console sessions ended before their expiry: what a logout revokes, checked wherever a session is accepted.

A session cookie is signed, so on its own it stays valid until its expiry whatever the browser does with it; a
logout that only asks the browser to forget the cookie revokes nothing (a copied cookie, or an open live stream,
carries on). A logout therefore records the session's random id (``AdminSession.sid``) here, until the session's
own expiry (past it the signature check refuses the cookie anyway), and every console request and every open
stream asks ``revoked``.

Scope: always this replica (an in-memory map, pruned of expired entries on each revocation: it holds at most the
sessions logged out within one ``admin.session_ttl_s``, each logout needing an admin credential, and those of them
this replica was shown since, which it found revoked in Redis and keeps from then on). With Redis
configured, also every replica sharing it: one key per revoked session (``bastion:admin:revoked:<sid>``) expiring
with the session. Without Redis, another replica signing with the same ``admin.secret`` accepts a logged-out cookie
until it expires (without ``admin.secret`` each replica has its own key, and no other replica ever accepted it).
While Redis is unreachable a check answers from this replica's own revocations (an admin is not locked out of the
console during an outage, when it is needed most), and a logout revokes on this replica only; both are logged, and
the logout's audit record says which it was.

A revocation on this replica wakes the streams waiting in ``wait_ended`` at once; a revocation through another
replica reaches an open stream at its next check (each keep-alive tick, and before anything is sent).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from bastion.admin.session import AdminSession

log = structlog.get_logger("bastion.admin")

PREFIX = "bastion:admin:revoked:"
TIMEOUT_S = 0.5


class Revocations:
    def __init__(self, redis: aioredis.Redis | None = None, *, clock: Callable[[], float] = time.time,
                 prefix: str = PREFIX, timeout_s: float = TIMEOUT_S) -> None:
        self._redis = redis
        self._clock = clock
        self._prefix = prefix
        self._timeout_s = timeout_s
        # Revoked session id -> that session's own expiry (when the entry may go).
        self._local: dict[str, float] = {}
        self._changed = asyncio.Event()

    @property
    def shared(self) -> bool:
        """Whether revocations reach other replicas (Redis is configured)."""
        return self._redis is not None

    def __len__(self) -> int:
        return len(self._local)

    async def revoke(self, session: AdminSession) -> bool:
        """Revoke ``session`` until its expiry: on this replica at once, and in Redis when configured. True when
        the revocation reached Redis (every replica sharing it), False when it holds on this replica only."""
        now = self._clock()
        self._local = {sid: expires for sid, expires in self._local.items() if expires > now}
        self._local[session.sid] = session.expires
        # Wake every waiter once; each re-arms by waiting on the fresh event.
        event, self._changed = self._changed, asyncio.Event()
        event.set()
        if self._redis is None:
            return False
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._redis.set(self._prefix + session.sid, b"1", pxat=max(int(session.expires * 1000), 1))
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("admin.revoke_unshared", detail=f"Redis unavailable ({type(exc).__name__}): the logout "
                                                        "holds on this replica only")
            return False
        return True

    def revoked_here(self, session: AdminSession) -> bool:
        return session.sid in self._local

    async def revoked(self, session: AdminSession) -> bool:
        """Whether ``session`` was revoked, here or (with Redis) through any replica."""
        if session.sid in self._local:
            return True
        if self._redis is None:
            return False
        try:
            async with asyncio.timeout(self._timeout_s):
                found = await self._redis.exists(self._prefix + session.sid)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("admin.revocation_unchecked",
                        detail=f"Redis unavailable ({type(exc).__name__}): only this replica's logouts are checked")
            return False
        if found:
            # A revocation is final until the session's expiry: once seen, this replica keeps it, so a Redis that
            # goes away or restarts empty (no persistence) cannot give a logged-out cookie back its session.
            self._local[session.sid] = session.expires
        return bool(found)

    async def wait_ended(self, session: AdminSession) -> None:
        """Return once ``session`` is revoked on this replica or has expired (by the console's clock)."""
        while session.sid not in self._local:
            remaining = session.expires - self._clock()
            if remaining <= 0:
                return
            event = self._changed
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                pass
