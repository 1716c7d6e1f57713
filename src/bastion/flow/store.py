"""Where contexts' touches live: in this process, or in Redis so every replica sees the same context.

Bounded both ways: a context keeps at most ``max_touches`` touches (oldest dropped) for at most ``retention``
seconds, and expires as a whole once untouched for that long (a session's context outlives the session by at most
that; session ids are never reused). The in-memory store also bounds how many contexts it holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import orjson
import redis.asyncio as aioredis

from bastion.deadlines import Deadlines
from bastion.policy.flow import Touch

__all__ = ["FlowStore", "MemoryFlowStore", "RedisFlowStore"]


class FlowStore(Protocol):
    async def history(self, context: str, since: float) -> tuple[Touch, ...]:
        """The touches of ``context`` at or after ``since`` (epoch seconds). Raises on a store failure."""
        ...

    async def add(self, context: str, touches: Sequence[Touch], *, retention_s: float, max_touches: int) -> None:
        """Append ``touches`` to ``context``, dropping what is older than ``retention_s`` or beyond
        ``max_touches``."""
        ...


class MemoryFlowStore:
    """One process's contexts, least recently used dropped beyond ``max_contexts``."""

    def __init__(self, max_contexts: int = 100_000) -> None:
        self._contexts: OrderedDict[str, list[Touch]] = OrderedDict()
        self._max_contexts = max_contexts

    async def history(self, context: str, since: float) -> tuple[Touch, ...]:
        return tuple(t for t in self._contexts.get(context, ()) if t.at >= since)

    async def add(self, context: str, touches: Sequence[Touch], *, retention_s: float, max_touches: int) -> None:
        if not touches:
            return
        cutoff = max(t.at for t in touches) - retention_s
        kept = self._contexts.pop(context, [])
        if kept and min(kept[0].at, kept[-1].at) < cutoff:  # appended in time order, so usually a no-op
            kept = [t for t in kept if t.at >= cutoff]
        kept.extend(touches)
        del kept[:-max_touches]
        self._contexts[context] = kept
        while len(self._contexts) > self._max_contexts:
            self._contexts.popitem(last=False)


class RedisFlowStore:
    """One sorted set per context (score: time), ``bastion:flow:{<context>}``. The braces are a Redis Cluster hash
    tag: everything of one context is one key in one slot, so each read and write is one round trip, and a
    future second key per context stays in that slot. Every command is bounded by ``timeout_s``."""

    def __init__(self, client: aioredis.Redis, *, prefix: str = "bastion:flow:", timeout_s: float = 0.5) -> None:
        self._redis = client
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._deadlines = Deadlines()

    def key(self, context: str) -> str:
        return f"{self._prefix}{{{context}}}"

    async def history(self, context: str, since: float) -> tuple[Touch, ...]:
        with self._deadlines.after(self._timeout_s):
            raw = await self._redis.zrangebyscore(self.key(context), since, "+inf")
        return tuple(Touch.from_json(orjson.loads(item)) for item in raw if isinstance(item, bytes | str))

    async def add(self, context: str, touches: Sequence[Touch], *, retention_s: float, max_touches: int) -> None:
        if not touches:
            return
        key = self.key(context)
        newest = max(t.at for t in touches)
        with self._deadlines.after(self._timeout_s):
            # One MULTI on one key: the append, both bounds and the expiry land together.
            pipe = self._redis.pipeline(transaction=True)
            pipe.zadd(key, {orjson.dumps(t.as_json()): t.at for t in touches})
            pipe.zremrangebyscore(key, "-inf", f"({newest - retention_s}")
            pipe.zremrangebyrank(key, 0, -max_touches - 1)
            pipe.pexpire(key, int(retention_s * 1000))
            await pipe.execute()
