"""Deadlines for one component's awaits, kept on one event-loop timer instead of one timer per await.

``asyncio.timeout`` costs 6.6-7.8 µs of CPU per use (``bench/bench_timeouts.py``), and the calls on the
tools/call path pay it once per timed await (the upstream request, the rate limiter's script, the session
store): uvloop allocates and starts a libuv timer for each one and stops and frees it again (2.1 µs), the context
manager is two coroutines, and ``current_task`` plus ``get_running_loop`` make three ``getpid`` system calls on
Python 3.11 (its running-loop check compares process ids). Almost every such await ends long before its
deadline, so that timer is set up to be thrown away.

``Deadlines`` keeps the deadlines of its component's awaits in a heap and one timer armed for the earliest one. A
``with deadlines.after(seconds):`` block costs a heap push and, on the way out, a flag (about 1.5 µs); the timer is
re-armed only when a new deadline is earlier than the armed one (never, when every await gets the same timeout)
and when it fires. When it fires, the blocks whose deadline has passed are expired exactly as ``asyncio.timeout``
expires them: their task is cancelled, and the block raises ``TimeoutError`` when it is left by that
cancellation and no other cancellation was requested meanwhile (``Task.uncancel``). Deadlines are as precise as
``asyncio.timeout``'s: the timer is armed for the earliest one, not on a coarser clock.

Blocks that end in time are dropped from the heap lazily: when the timer fires with them on top, or when more than
half of the heap is finished blocks (then the heap is rebuilt, so it holds at most about twice the blocks in
flight, whatever the timeout).

One ``Deadlines`` per component (an upstream session, a limiter, a store), not one per process: no module-level
state, and a component's heap holds only its own awaits. It binds to the event loop it is first used on and
rebinds when it is used on another one (tests run one loop after another); the blocks of the old loop are dropped.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from types import TracebackType
from typing import Any

__all__ = ["Deadline", "Deadlines"]

# Rebuilding the heap is worth it once this many finished blocks wait in it (and they are over half of it).
_COMPACT_AFTER = 64

_ACTIVE, _EXPIRED, _DONE = 0, 1, 2
# A deadline this close counts as reached when the timer fires: uvloop's clock and timers have millisecond
# resolution, and asyncio's own loop treats timers within its clock resolution as due the same way.
_RESOLUTION_S = 0.001


class Deadline:
    """One timed block (``Deadlines.after``): a synchronous context manager, since leaving it needs no await."""

    __slots__ = ("_cancelling", "_owner", "_state", "_task")

    def __init__(self, owner: Deadlines | None, task: asyncio.Task[Any]) -> None:
        self._owner = owner  # None for a block without a deadline (it is in no heap)
        self._task = task
        self._cancelling = task.cancelling()
        self._state = _ACTIVE

    def expired(self) -> bool:
        """Whether the deadline passed while the block ran (as ``asyncio.Timeout.expired``)."""
        return self._state == _EXPIRED

    def __enter__(self) -> Deadline:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._state == _EXPIRED:
            # asyncio.Timeout's rule: the cancellation is ours to turn into TimeoutError only when nobody else
            # asked to cancel the task meanwhile.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
            return
        self._state = _DONE
        owner = self._owner
        if owner is not None:
            owner._finished += 1

    def _expire(self) -> None:
        self._state = _EXPIRED
        self._task.cancel()


class Deadlines:
    """The deadlines of one component's awaits, on one timer (see the module's note)."""

    __slots__ = ("_armed_at", "_epoch", "_finished", "_heap", "_loop", "_order", "_timer")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()  # ties between equal deadlines, so the heap never compares blocks
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = math.inf
        self._finished = 0  # finished blocks still in the heap
        self._epoch = 0  # bumped at each rebinding: a timer armed for an earlier loop then does nothing

    def after(self, delay: float | None) -> Deadline:
        """A block that expires ``delay`` seconds from now; ``None``: one that never does. Must run in a task."""
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if loop is None or task is None:
            # First use, or a different loop: ``current_task(loop)`` finds no task of ours running on the old one.
            loop = self._bind()
            task = asyncio.current_task(loop)
            if task is None:
                raise RuntimeError("a deadline must be used inside a task")
        if delay is None:
            return Deadline(None, task)
        when = loop.time() + delay
        block = Deadline(self, task)
        heapq.heappush(self._heap, (when, next(self._order), block))
        if when < self._armed_at:
            self._arm(when)
        elif self._finished > _COMPACT_AFTER and self._finished * 2 > len(self._heap):
            self._compact()
        return block

    def __len__(self) -> int:
        """Blocks in the heap, finished ones not yet dropped included (for tests and for memory bounds)."""
        return len(self._heap)

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # The old loop's timer and blocks go with it; should that loop run again and its timer fire, the
            # timer finds the epoch changed and does nothing.
            self._epoch += 1
            self._loop = loop
            self._heap = []
            self._timer = None
            self._armed_at = math.inf
            self._finished = 0
        return loop

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = when
        self._timer = self._loop.call_at(when, self._fire, self._epoch)

    def _compact(self) -> None:
        self._heap = [entry for entry in self._heap if entry[2]._state == _ACTIVE]
        heapq.heapify(self._heap)
        self._finished = 0

    def _fire(self, epoch: int) -> None:
        if epoch != self._epoch:
            return
        self._timer = None
        self._armed_at = math.inf
        loop = self._loop
        if loop is None:  # pragma: no cover - a timer is only armed once bound
            return
        due = loop.time() + _RESOLUTION_S
        heap = self._heap
        while heap:
            when, _, block = heap[0]
            if block._state != _ACTIVE:
                heapq.heappop(heap)
                self._finished -= 1
                continue
            if when > due:
                break
            heapq.heappop(heap)
            block._expire()
        if heap:
            # Re-armed for the earliest block still active.
            self._arm(heap[0][0])
