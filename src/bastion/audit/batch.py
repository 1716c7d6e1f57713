"""Group commit for a blocking writer: records queue on the event loop and reach the worker thread a batch at a time.

Handing every record to a thread on its own (one ``ThreadPoolExecutor.submit``, one future, one loop wake-up per
record) cost about a third of the event loop's busy time under load. ``BatchWriter`` keeps the single worker
thread (a slow disk still never blocks the loop) but hands it everything queued since the previous batch started,
with one hand-off and one wake-up per batch. At one call at a time every batch holds one record, as before; under
load the batches grow by themselves while the worker is busy, which is when it pays. The worker is a thread of
its own fed through a C queue, not a ``ThreadPoolExecutor``: the executor's Python futures, work items and
condition variables cost about 50,000 instructions per hand-off, a quarter of what a record cost at one call at a
time (``python bench/bench_audit.py``; docs/performance.md).

The thread is a daemon, so a process that exits without closing its sinks does not hang on it; whatever was
queued then belonged to calls not yet answered, and ``close`` (which every shutdown path runs) writes it all.

The contract for the caller does not change: ``submit`` returns once the batch holding its line was written (so a
call is still answered only after its record reached the OS, or the disk in ``fsync`` mode), and raises the
writer's ``OSError`` when that batch failed. Lines are written in the order ``submit`` was called.

The queue is bounded (``max_queued`` lines admitted and not yet written, the batch on the worker included). A
writer slower than the calls fills it, and further ``submit`` calls then wait, first come first served, until a
batch completes: backpressure on the calls, never a dropped record.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["BatchWriter", "WriterClosed"]


class WriterClosed(RuntimeError):
    """``submit`` after ``close``."""


class BatchWriter:
    """``write_batch`` runs on one dedicated thread, one batch at a time, so lines stay in order and the writer
    needs no lock. It raises ``OSError`` for a failed batch (every line of that batch is then reported failed)."""

    def __init__(self, write_batch: Callable[[list[bytes]], None], *, thread_name: str,
                 max_queued: int = 4096, max_batch: int = 1024) -> None:
        if max_queued < 1 or max_batch < 1:
            raise ValueError("max_queued and max_batch must be positive")
        self._write_batch = write_batch
        self.max_queued = max_queued
        self.max_batch = max_batch
        self._thread_name = thread_name
        # The worker's inbox: a batch to write, ``finish`` at close, or ``None`` to stop.
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lines: list[bytes] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._queued = 0  # admitted and not yet written: the queue plus the batch on the worker
        self._room: deque[asyncio.Future[None]] = deque()  # submitters waiting for the queue to have room
        self._busy = False  # a batch is on the worker, or its hand-off is scheduled
        self._closed = False
        self._stopped = False
        self._drained: asyncio.Future[None] | None = None
        self.batches = 0  # batches handed to the worker since start (for tests and benchmarks)

    @property
    def queued(self) -> int:
        """Lines admitted and not yet written."""
        return self._queued

    @property
    def waiting(self) -> int:
        """Submitters held back because the queue is full."""
        return len(self._room)

    async def submit(self, line: bytes) -> None:
        """Queue ``line``; return once the batch holding it is written. Raises ``OSError`` if that batch failed,
        ``WriterClosed`` after ``close``."""
        if self._closed:
            raise WriterClosed("audit writer is closed")
        loop = asyncio.get_running_loop()
        if self._room or self._queued >= self.max_queued:
            await self._wait_for_room(loop)  # returns holding a slot
        else:
            self._queued += 1
        done = loop.create_future()
        self._lines.append(line)
        self._waiters.append(done)
        if not self._busy:
            self._busy = True
            # Soon, not now: every record queued in this turn of the loop joins the same batch.
            loop.call_soon(self._hand_off, loop)
        # Not shielded: a caller cancelled here only stops waiting; its line is already queued and still written,
        # so the call keeps its one record.
        await done

    async def close(self, finish: Callable[[], None] | None = None) -> None:
        """Refuse new lines, wait until every admitted (or waiting) line is written, then run ``finish`` on the
        worker (closing the file) and stop the thread."""
        if self._closed and self._stopped:
            return  # closed twice (shutdown paths may overlap): nothing left to write or close
        self._closed = True
        loop = asyncio.get_running_loop()
        if self._queued or self._room:
            self._drained = loop.create_future()
            await self._drained
        try:
            if finish is not None:
                finished: asyncio.Future[None] = loop.create_future()
                self._send(_Job(finish, loop, lambda exc: _settle(finished, exc)))
                await finished
        finally:
            if self._thread is not None:
                self._inbox.put(None)
            self._stopped = True

    async def _wait_for_room(self, loop: asyncio.AbstractEventLoop) -> None:
        ticket = loop.create_future()
        self._room.append(ticket)
        try:
            await ticket
        except asyncio.CancelledError:
            if ticket.done() and not ticket.cancelled():
                # Granted a slot, then cancelled before using it: hand the slot to the next in line.
                self._queued -= 1
                self._admit()
            else:
                self._room.remove(ticket)
                self._maybe_drained()
            raise

    def _admit(self) -> None:
        while self._room and self._queued < self.max_queued:
            ticket = self._room.popleft()
            if ticket.done():  # its submitter was cancelled while waiting
                continue
            self._queued += 1
            ticket.set_result(None)

    def _hand_off(self, loop: asyncio.AbstractEventLoop) -> None:
        n = self.max_batch
        if len(self._lines) <= n:
            lines, self._lines, waiters, self._waiters = self._lines, [], self._waiters, []
        else:
            lines, self._lines = self._lines[:n], self._lines[n:]
            waiters, self._waiters = self._waiters[:n], self._waiters[n:]
        self.batches += 1
        write = self._write_batch
        self._send(_Job(lambda: write(lines), loop, lambda exc: self._written(exc, waiters, loop)))

    def _send(self, job: _Job) -> None:
        if self._thread is None:
            # Started on first use, so a sink that never writes has no thread.
            self._thread = threading.Thread(target=_work, args=(self._inbox,), name=self._thread_name, daemon=True)
            self._thread.start()
        self._inbox.put(job)

    def _written(self, exc: BaseException | None, waiters: list[asyncio.Future[None]],
                 loop: asyncio.AbstractEventLoop) -> None:
        for done in waiters:
            if done.done():  # its caller was cancelled; the line was written (or failed) all the same
                continue
            if exc is None:
                done.set_result(None)
            else:
                done.set_exception(exc)
        self._queued -= len(waiters)
        self._admit()
        if self._lines:
            self._hand_off(loop)  # what queued meanwhile is the next batch: no need to wait another turn
        else:
            self._busy = False
        self._maybe_drained()

    def _maybe_drained(self) -> None:
        if self._drained is not None and not self._drained.done() and not self._queued and not self._room:
            self._drained.set_result(None)


class _Job:
    """One piece of work for the worker thread, and what to run on ``loop`` with its exception when done."""

    __slots__ = ("done", "loop", "run")

    def __init__(self, run: Callable[[], None], loop: asyncio.AbstractEventLoop,
                 done: Callable[[BaseException | None], None]) -> None:
        self.run = run
        self.loop = loop
        self.done = done


def _work(inbox: queue.SimpleQueue[_Job | None]) -> None:
    """The worker thread: one job at a time, in order, until ``None``."""
    while (job := inbox.get()) is not None:
        exc: BaseException | None = None
        try:
            job.run()
        except BaseException as caught:  # handed to the loop: the batch's callers get it as theirs
            exc = caught
        # RuntimeError: the loop closed while this job ran (a process shutting down without closing its
        # sinks); nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(job.done, exc)
        del job, exc


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
