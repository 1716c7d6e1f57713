"""Where audit records go: stdout, a rotating JSON-lines file, a Redis stream.

Every sink writes one record per ``write`` as one JSON line (or one stream entry), and raises ``AuditSinkError``
(never a raw ``OSError`` or ``RedisError``) when it could not. Deciding what a failure means (log it, or refuse the
call) is ``AuditLog``'s job, not the sink's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import IO, Any, Protocol

import orjson
import redis.asyncio
import redis.exceptions

from bastion.audit.batch import BatchWriter, WriterClosed
from bastion.deadlines import Deadlines
from bastion.errors import BastionError
from bastion.pipes import NoWait, write_all

__all__ = ["AuditSink", "AuditSinkError", "FileSink", "RedisStreamSink", "StdoutSink", "encode_record"]


class AuditSinkError(BastionError):
    """A sink could not write a record. Operators see it in the log; clients never do."""

    def __init__(self, sink: str, detail: str) -> None:
        super().__init__(f"audit sink {sink} failed: {detail}")
        self.sink = sink
        self.detail = detail


class AuditSink(Protocol):
    """One destination for audit records. ``name`` is stable and bounded (it becomes a metric label)."""

    name: str

    async def write(self, record: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


def encode_record(record: dict[str, Any]) -> bytes:
    """One JSON line, newline included. ``default=repr`` so an odd value degrades to text instead of a lost record."""
    return orjson.dumps(record, default=repr, option=orjson.OPT_APPEND_NEWLINE)


class StdoutSink:
    """JSON lines on standard output, the container default (the runtime ships stdout to the log pipeline).

    Standard output is a pipe there, and a pipe whose reader stalls fills up (``bastion.pipes``). So each record
    is written without waiting (the pipe takes the whole line, or nothing, or part of a long one). What the pipe
    cannot take now goes to a worker thread (``BatchWriter``) that waits for room, and every record after it
    follows it there until the thread has caught up, so lines keep their order and never interleave. A full pipe
    then holds back only what waits for a record (at most 4096 queued, then backpressure, as the file sink),
    never anything else.

    Where standard output cannot be written without waiting (a regular file, a terminal), every record goes
    through the thread. Either way ``write`` returns once the record reached the OS. Logs go to stderr, so
    nothing else shares this stream.
    """

    name = "stdout"

    def __init__(self, fd: int | None = None, *, max_queued: int = 4096, max_batch: int = 1024) -> None:
        if fd is None:
            sys.stdout.flush()  # whatever Python buffered goes first; records bypass its buffer from here on
            fd = sys.stdout.fileno()
        self._nowait = NoWait(fd)
        self.inline = 0  # records written without the thread (for tests and benchmarks)
        self.writer = BatchWriter(self._write_batch_sync, thread_name="bastion-audit-stdout",
                                  max_queued=max_queued, max_batch=max_batch)

    async def write(self, record: dict[str, Any]) -> None:
        line = encode_record(record)
        if self._nowait.supported and not self.writer.queued:
            try:
                written = self._nowait.write(line) or 0
            except OSError as exc:
                raise AuditSinkError(self.name, f"{type(exc).__name__}: {exc.strerror or exc}") from None
            if written == len(line):
                self.inline += 1
                return
            line = line[written:]
        try:
            await self.writer.submit(line)
        except OSError as exc:
            raise AuditSinkError(self.name, f"{type(exc).__name__}: {exc.strerror or exc}") from None
        except WriterClosed as exc:
            raise AuditSinkError(self.name, str(exc)) from None

    async def close(self) -> None:
        """Write every record already queued; standard output itself stays open."""
        with contextlib.suppress(OSError):
            await self.writer.close()

    def _write_batch_sync(self, lines: list[bytes]) -> None:
        write_all(self._nowait.fd, b"".join(lines))


class FileSink:
    """JSON lines in a file, flushed to the OS after every batch of records, rotated by size (``path.1`` ...
    ``path.N``).

    Disk writes (and rotation, which renames files) run on one dedicated worker thread rather than the event
    loop: a slow or stalled disk then delays only the audited calls waiting for their records, never every other
    request. Records reach that thread in batches (``BatchWriter``: one hand-off per batch, not per record), and
    ``write`` returns once the batch holding its record was flushed (and fsynced with ``fsync``), so a call is
    still answered only after its record is written. One worker, so records land in the order they were emitted
    and rotation needs no lock. The file is (re)opened on demand, so a sink whose directory appears later recovers
    without a restart; and before each batch the open file is checked to still be the one at the path, so a file
    an external rotator moved or removed is followed (the next batch goes to a new file at the path) instead of
    written on where nobody reads it. A reopen that fails is a sink failure like any other.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 50 * 1024 * 1024, backups: int = 5,
                 fsync: bool = False, max_queued: int = 4096, max_batch: int = 1024) -> None:
        self.path = Path(path)
        self.name = f"file:{self.path}"
        self.max_bytes = max_bytes
        self.backups = backups
        self.fsync = fsync
        self._fh: IO[bytes] | None = None
        self._size = 0
        self.writer = BatchWriter(self._write_batch_sync, thread_name="bastion-audit-file",
                                  max_queued=max_queued, max_batch=max_batch)

    async def write(self, record: dict[str, Any]) -> None:
        line = encode_record(record)
        try:
            await self.writer.submit(line)
        except OSError as exc:
            raise AuditSinkError(self.name, f"{type(exc).__name__}: {exc.strerror or exc}") from None
        except WriterClosed as exc:
            raise AuditSinkError(self.name, str(exc)) from None

    async def close(self) -> None:
        """Write every record already queued (shutdown loses none of them), then close the file."""
        with contextlib.suppress(OSError):
            await self.writer.close(self._close_sync)

    def _write_batch_sync(self, lines: list[bytes]) -> None:
        if self._fh is not None and not self._at_path(self._fh):
            # Removed or moved away (logrotate without copytruncate, an operator's rm): writing on would put the
            # records in a file nobody reads, or in no file at all, without an error to say so.
            self._close_sync()
        if self._fh is None:
            self._open()
        try:
            chunk: list[bytes] = []
            size = self._size
            for line in lines:
                if self.max_bytes > 0 and size > 0 and size + len(line) > self.max_bytes:
                    self._flush(chunk)
                    chunk = []
                    self._rotate()
                    size = self._size
                chunk.append(line)
                size += len(line)
            self._flush(chunk)
        except OSError:
            # Drop the handle: the next batch reopens, which is how a transient failure (disk full, NFS hiccup)
            # heals without a restart. The whole batch counts as failed, even if part of it reached the file.
            self._close_sync()
            raise

    def _flush(self, chunk: list[bytes]) -> None:
        if not chunk:
            return
        fh = self._fh
        assert fh is not None
        data = b"".join(chunk)
        fh.write(data)
        fh.flush()
        if self.fsync:
            # Once per batch: every call waiting on this batch gets its durability from the same fsync.
            os.fsync(fh.fileno())
        self._size += len(data)

    def _at_path(self, fh: IO[bytes]) -> bool:
        """Whether the open file is still the one at ``path`` (as ``logging.handlers.WatchedFileHandler`` checks):
        one ``stat`` per batch, not per record."""
        try:
            here = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fh.fileno())
        return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)

    def _open(self) -> None:
        self._fh = self.path.open("ab")
        # fstat, not tell(): a FIFO (a pipe to a collector) cannot seek, and its size is 0 either way.
        self._size = os.fstat(self._fh.fileno()).st_size

    def _rotate(self) -> None:
        self._close_sync()
        if self.backups > 0:
            for i in range(self.backups - 1, 0, -1):
                src = self._backup(i)
                if src.exists():
                    src.replace(self._backup(i + 1))
            self.path.replace(self._backup(1))
        else:
            self.path.unlink(missing_ok=True)
        self._open()

    def _backup(self, i: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{i}")

    def _close_sync(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()


class RedisStreamSink:
    """Entries appended to a Redis stream for a collector to consume (``XADD key MAXLEN ~ n * record <json>``).

    The approximate trim keeps ``XADD`` O(1) amortised; the stream holds at least ``maxlen`` recent records. Each
    write is bounded by ``timeout_s`` so a hung Redis costs a call at most that long (then counts as a failure).
    The client is injected and owned by the caller.
    """

    def __init__(self, client: redis.asyncio.Redis, key: str, *, maxlen: int = 100_000,
                 timeout_s: float = 2.0) -> None:
        self.key = key
        self.name = f"redis:{key}"
        self.maxlen = maxlen
        self.timeout_s = timeout_s
        self._client = client
        self._deadlines = Deadlines()

    async def write(self, record: dict[str, Any]) -> None:
        payload = orjson.dumps(record, default=repr)
        try:
            with self._deadlines.after(self.timeout_s):
                await self._client.xadd(self.key, {"record": payload}, maxlen=self.maxlen, approximate=True)
        except TimeoutError:
            raise AuditSinkError(self.name, f"XADD timed out after {self.timeout_s:g}s") from None
        except (redis.exceptions.RedisError, OSError) as exc:
            raise AuditSinkError(self.name, f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        """Nothing to do: the Redis client belongs to the caller, who closes it."""
