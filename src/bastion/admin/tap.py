"""``AuditTap``: the newest audit records in memory, for the live table and the per-minute rates.

It listens on the audit log (``AuditLog.listeners``): ``__call__`` runs inside ``emit``, so it only appends to a
bounded deque and wakes the waiters; it never blocks and never raises. Each record gets a sequence number, which
an SSE client sends back as ``Last-Event-ID`` to resume without gaps or repeats (as long as the buffer still holds
what it missed).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any


class AuditTap:
    def __init__(self, size: int, clock: Callable[[], float] = time.time) -> None:
        self._records: deque[tuple[int, float, dict[str, Any]]] = deque(maxlen=size)
        self._seq = 0
        self._clock = clock
        self._changed = asyncio.Event()

    def __call__(self, record: dict[str, Any]) -> None:
        self._seq += 1
        self._records.append((self._seq, self._clock(), record))
        # Wake every waiter once; each re-arms by waiting on the fresh event.
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    @property
    def last(self) -> int:
        return self._seq

    def since(self, seq: int) -> list[tuple[int, dict[str, Any]]]:
        return [(s, r) for s, _, r in self._records if s > seq]

    async def wait(self, seq: int, timeout: float) -> list[tuple[int, dict[str, Any]]]:
        """Records after ``seq``, waiting up to ``timeout`` seconds for one (an empty list on timeout)."""
        if self._seq <= seq:
            event = self._changed
            try:
                async with asyncio.timeout(timeout):
                    await event.wait()
            except TimeoutError:
                return []
        return self.since(seq)

    def per_minute(self, now: float | None = None) -> dict[str, int]:
        """Tool calls in the last 60 seconds, by decision (``allow``, ``deny``, ``error``…), and ``calls``."""
        cutoff = (self._clock() if now is None else now) - 60.0
        out: dict[str, int] = {"calls": 0}
        for _, at, record in reversed(self._records):
            if at < cutoff:
                break
            if record.get("event") != "tool.call":
                continue
            out["calls"] += 1
            decision = str(record.get("decision") or "unknown")
            out[decision] = out.get(decision, 0) + 1
        return out
