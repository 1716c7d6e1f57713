"""Where pending approvals live: this process, or Redis shared by every replica.

The store holds the pending entries and enforces the caps; ``claim`` removes an entry and says whether this
caller was first, so exactly one verdict wins however many approvers (user, admins on other replicas, the
timeout) answer at once. Verdicts travel to the waiting replica over pub/sub (``RedisApprovalStore.listen``).

Redis keys (one hash tag, ``{bastion-approvals}``, so the scripts' two keys share a Cluster slot):
``bastion:{bastion-approvals}:pending`` (hash id -> JSON), ``bastion:{bastion-approvals}:count`` (hash principal
-> pending count), channel ``bastion:{bastion-approvals}:events``, and ``bastion:{bastion-approvals}:remember:*``
keys with a TTL for remembered yeses.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import redis.asyncio as aioredis

from bastion.approvals.model import PendingApproval
from bastion.redisconn import open_pubsub

PREFIX = "bastion:{bastion-approvals}:"
PENDING_KEY = PREFIX + "pending"
COUNT_KEY = PREFIX + "count"
EVENTS_CHANNEL = PREFIX + "events"
REMEMBER_PREFIX = PREFIX + "remember:"

# KEYS: pending, count. ARGV: id, principal, json, max_total, max_per_principal. Returns 1, or 0 (total cap), or
# -1 (per-principal cap). One script, so two replicas cannot both take the last place.
_OPEN = """
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
local n = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if n >= tonumber(ARGV[5]) then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
return 1
"""
# KEYS: pending, count. ARGV: id. Returns the removed entry's JSON, or false when it was already gone.
_CLAIM = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
local principal = cjson.decode(raw)['principal']
if redis.call('HINCRBY', KEYS[2], principal, -1) <= 0 then redis.call('HDEL', KEYS[2], principal) end
return raw
"""


class ApprovalStore(Protocol):
    async def open(self, pending: PendingApproval, max_total: int, max_per_principal: int) -> int: ...

    async def claim(self, approval_id: str) -> PendingApproval | None: ...

    async def list(self) -> list[PendingApproval]: ...

    async def get(self, approval_id: str) -> PendingApproval | None: ...

    async def remember(self, key: str, ttl_s: float) -> None: ...

    async def remembered(self, key: str) -> bool: ...


class MemoryApprovalStore:
    """One replica's pending approvals."""

    def __init__(self) -> None:
        self._pending: dict[str, PendingApproval] = {}
        self._remembered: dict[str, float] = {}

    async def open(self, pending: PendingApproval, max_total: int, max_per_principal: int) -> int:
        if len(self._pending) >= max_total:
            return 0
        if sum(1 for p in self._pending.values() if p.principal == pending.principal) >= max_per_principal:
            return -1
        self._pending[pending.id] = pending
        return 1

    async def claim(self, approval_id: str) -> PendingApproval | None:
        return self._pending.pop(approval_id, None)

    async def list(self) -> list[PendingApproval]:
        return sorted(self._pending.values(), key=lambda p: p.created_at)

    async def get(self, approval_id: str) -> PendingApproval | None:
        return self._pending.get(approval_id)

    async def remember(self, key: str, ttl_s: float) -> None:
        now = time.monotonic()
        for stale in [k for k, until in self._remembered.items() if until <= now]:
            del self._remembered[stale]
        self._remembered[key] = now + ttl_s

    async def remembered(self, key: str) -> bool:
        until = self._remembered.get(key)
        return until is not None and until > time.monotonic()


class RedisApprovalStore:
    """Pending approvals shared by every replica through Redis."""

    def __init__(self, client: aioredis.Redis, listen_client: aioredis.Redis | None = None) -> None:
        self._redis = client
        self._listen_client = listen_client or client
        self._open = client.register_script(_OPEN)
        self._claim = client.register_script(_CLAIM)

    async def open(self, pending: PendingApproval, max_total: int, max_per_principal: int) -> int:
        result = await self._open(keys=[PENDING_KEY, COUNT_KEY],
                                  args=[pending.id, pending.principal, json.dumps(pending.to_json()), max_total,
                                        max_per_principal])
        return int(result)

    async def claim(self, approval_id: str) -> PendingApproval | None:
        raw = await self._claim(keys=[PENDING_KEY, COUNT_KEY], args=[approval_id])
        return PendingApproval.from_json(json.loads(raw)) if raw else None

    async def list(self) -> list[PendingApproval]:
        raw = await self._redis.hvals(PENDING_KEY)
        return sorted((PendingApproval.from_json(json.loads(r)) for r in raw), key=lambda p: p.created_at)

    async def get(self, approval_id: str) -> PendingApproval | None:
        raw = await self._redis.hget(PENDING_KEY, approval_id)
        return PendingApproval.from_json(json.loads(raw)) if raw else None

    async def remember(self, key: str, ttl_s: float) -> None:
        await self._redis.set(REMEMBER_PREFIX + key, "1", px=max(1, int(ttl_s * 1000)))

    async def remembered(self, key: str) -> bool:
        return bool(await self._redis.exists(REMEMBER_PREFIX + key))

    async def publish(self, event: dict[str, Any]) -> None:
        await self._redis.publish(EVENTS_CHANNEL, json.dumps(event))

    async def listen(self) -> AsyncIterator[dict[str, Any]]:
        """Events from every replica (this one's included), until cancelled."""
        # open_pubsub: on a Cluster client the slot map must be loaded before the first SUBSCRIBE.
        pubsub = await open_pubsub(self._listen_client)
        await pubsub.subscribe(EVENTS_CHANNEL)
        try:
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is None or message.get("type") != "message":
                    continue
                try:
                    event = json.loads(message["data"])
                except ValueError:
                    continue
                if isinstance(event, dict):
                    yield event
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
