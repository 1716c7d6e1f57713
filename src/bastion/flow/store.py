"""Where contexts' touches live: in this process, or in Redis so every replica sees the same context.

Bounded both ways: a context keeps at most ``max_touches`` touches (oldest dropped) for at most ``retention``
seconds, and expires as a whole once untouched for that long (a session's context outlives the session by at most
that; session ids are never reused). The in-memory store also bounds how many contexts it holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson
import redis.asyncio as aioredis

from bastion.deadlines import Deadlines
from bastion.policy.flow import Touch

__all__ = ["FlowStore", "HistoryLost", "MemoryFlowStore", "RedisFlowStore"]


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


class HistoryLost(Exception):
    """A context's history in Redis lacks a touch this replica wrote to it: Redis lost data (restarted without
    persistence, flushed, failed over to a replica that had not received it) or the write itself failed."""


class RedisFlowStore:
    """One sorted set per context (score: time), ``bastion:flow:{<context>}``. The braces are a Redis Cluster hash
    tag: everything of one context is one key in one slot, so each read and write is one round trip, and a
    future second key per context stays in that slot. Every command is bounded by ``timeout_s``.

    A history that lost touches reads as a shorter one, and a shorter history allows more: a session that had
    read private data could send it out once Redis restarted empty. So the replica remembers, per context, the
    newest touch it wrote (up to ``max_contexts`` contexts, least recently written dropped) and checks it is still
    there: in what a history read returns, and (one more command in the write's MULTI) at its next write. A touch
    found missing marks the context lost until that touch is out of a read's reach; a read then raises
    ``HistoryLost``, and the decision fails closed. No extra round trip."""

    def __init__(self, client: aioredis.Redis, *, prefix: str = "bastion:flow:", timeout_s: float = 0.5,
                 max_contexts: int = 100_000) -> None:
        self._redis = client
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._deadlines = Deadlines()
        self._written: OrderedDict[str, _Written] = OrderedDict()
        self._max_contexts = max_contexts

    def key(self, context: str) -> str:
        return f"{self._prefix}{{{context}}}"

    async def history(self, context: str, since: float) -> tuple[Touch, ...]:
        with self._deadlines.after(self._timeout_s):
            raw = await self._redis.zrangebyscore(self.key(context), since, "+inf")
        touches = tuple(Touch.from_json(orjson.loads(item)) for item in raw if isinstance(item, bytes | str))
        written = self._written.get(context)
        if written is not None:
            newest = written.newest
            if newest is not None and newest.at >= since and newest not in touches:
                written.lost_at = max(written.lost_at or 0.0, newest.at)
            if written.lost_at is not None and written.lost_at >= since:
                raise HistoryLost(f"the history of context {context[:200]!r} lost a touch written at "
                                  f"{written.lost_at:.3f}")
        return touches

    async def add(self, context: str, touches: Sequence[Touch], *, retention_s: float, max_touches: int) -> None:
        if not touches:
            return
        key = self.key(context)
        newest = max(touches, key=lambda t: t.at)
        written = self._written.get(context)
        previous = written.newest if written is not None else None
        try:
            with self._deadlines.after(self._timeout_s):
                # One MULTI on one key: the append, both bounds and the expiry land together. First, whether the
                # touch this replica wrote last is still there: if not, what came before this write was lost, and
                # a later read that finds this write would not know.
                pipe = self._redis.pipeline(transaction=True)
                if previous is not None:
                    pipe.zscore(key, orjson.dumps(previous.as_json()))
                pipe.zadd(key, {orjson.dumps(t.as_json()): t.at for t in touches})
                pipe.zremrangebyscore(key, "-inf", f"({newest.at - retention_s}")
                pipe.zremrangebyrank(key, 0, -max_touches - 1)
                pipe.pexpire(key, int(retention_s * 1000))
                results = await pipe.execute()
        except BaseException:
            # Not written (or not known to be): missing from the history as much as a lost touch.
            self._note(context, None, newest.at)
            raise
        # Noted once written, not before: a read of the same context meanwhile would miss it and call it lost.
        gone = previous is not None and results[0] is None and previous.at >= newest.at - retention_s
        self._note(context, newest, previous.at if gone and previous is not None else None)

    def _note(self, context: str, written: Touch | None, lost_at: float | None) -> None:
        entry = self._written.pop(context, None)
        if entry is None:
            entry = _Written(written)
        elif written is not None and (entry.newest is None or written.at >= entry.newest.at):
            entry.newest = written
        if lost_at is not None:
            entry.lost_at = max(entry.lost_at or 0.0, lost_at)
        self._written[context] = entry
        while len(self._written) > self._max_contexts:
            self._written.popitem(last=False)


@dataclass(slots=True)
class _Written:
    """What this replica wrote to a context: its newest touch, and the newest of its touches found lost."""

    newest: Touch | None
    lost_at: float | None = None
