"""A stdio child's stderr into the log, bounded: what a server writes there is its own, and may be hostile.

Without bounds, a child writing endless lines to stderr turns each into a log line: the gateway's CPU goes to
rendering them, its log grows as fast as the child writes, and every other upstream's calls slow down; a single
50 MB line without a newline would be held whole and logged as one 50 MB log line. Here:

- **Bounded reading.** stderr is read in chunks of at most ``CHUNK_BYTES``; of each line only the first
  ``max_line_bytes`` are kept, the rest is counted and discarded as it arrives, so this reader never holds more
  than a chunk and one cut line (and the stream's own buffer stays about a pipe's worth, 64 KiB, since it is
  drained as fast as it fills). After every ``YIELD_BYTES`` read without waiting, the reader yields to the event
  loop.
- **Cut lines.** A line longer than ``max_line_bytes`` is logged cut there (at a character boundary), with
  ``truncated=True`` and its original length in bytes as ``size``.
- **Rate limit per upstream.** A token bucket (``TokenBucket``, as for the front door's refusals): ``burst`` lines
  pass at once, then ``per_second``. Lines the bucket drops are counted, and at most every ``report_interval``
  seconds (and when the stream ends) one ``upstream.stderr_suppressed`` warning says how many (``count``). While
  the bucket is empty, the lines of a chunk are counted, never looked at one by one.
- **Escaped text.** Control and other non-printable characters (ESC, BEL, C1 controls, bidirectional
  overrides, ...) are written as ``\\xNN`` / ``\\uNNNN`` (``bastion.terminal.printable``) before the line
  reaches the log, whatever the renderer, so no terminal escape reaches an operator's terminal raw. The console
  log's own escaping (``bastion.logs``) then finds nothing left to escape.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import structlog

from bastion.bucket import TokenBucket
from bastion.terminal import printable

__all__ = ["CHUNK_BYTES", "DEFAULT_STDERR", "StderrHook", "StderrLimits", "StderrLog", "printable", "pump_stderr"]

log = structlog.get_logger("bastion.upstream")

CHUNK_BYTES = 64 * 1024
YIELD_BYTES = 1024 * 1024

StderrOutcome = Literal["logged", "truncated", "suppressed"]
# (upstream, outcome, lines): the app counts them in ``bastion_upstream_stderr_lines_total``.
StderrHook = Callable[[str, StderrOutcome, int], None]


@dataclass(frozen=True, slots=True)
class StderrLimits:
    """An upstream's ``stderr`` settings (``upstream.config``): line length, then a token bucket of lines."""

    max_line_bytes: int = 4096
    burst: int = 100
    per_second: float = 10.0


DEFAULT_STDERR = StderrLimits()


class StderrLog:
    """The log side of one upstream's stderr: cuts, escapes and rate-limits lines, counts what it suppresses.

    One per upstream, shared by the processes it runs in turn (a restarted child does not get a fresh burst).
    ``clock`` is injectable so the limits are testable without sleeping.
    """

    def __init__(self, upstream: str, limits: StderrLimits = DEFAULT_STDERR, *, report_interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, on_lines: StderrHook | None = None) -> None:
        self.upstream = upstream
        self.max_line_bytes = limits.max_line_bytes
        self._bucket = TokenBucket(float(limits.burst), limits.per_second)
        self._on_lines = on_lines
        self._interval = report_interval
        self._clock = clock
        self.suppressed = 0  # lines dropped since the last report
        self.report_due: float | None = None  # when the count of suppressed lines is to be logged

    def line(self, head: bytes, size: int) -> bool:
        """One line: its first bytes (at most ``max_line_bytes``, no line ending) and its full length. False when
        the rate limit suppressed it."""
        if not self._bucket.take(self._clock()):
            self.suppress(1)
            return False
        if size > len(head):
            log.info("upstream.stderr", upstream=self.upstream, line=printable(_decode(head, cut=True)),
                     truncated=True, size=size)
            if self._on_lines is not None:
                self._on_lines(self.upstream, "truncated", 1)
        else:
            text = _decode(head, cut=False).removesuffix("\r")
            log.info("upstream.stderr", upstream=self.upstream, line=printable(text))
            if self._on_lines is not None:
                self._on_lines(self.upstream, "logged", 1)
        self.report_if_due()
        return True

    def suppress(self, count: int) -> None:
        if count <= 0:
            return
        self.suppressed += count
        if self._on_lines is not None:
            self._on_lines(self.upstream, "suppressed", count)
        if self.report_due is None:
            self.report_due = self._clock() + self._interval

    def report_if_due(self) -> None:
        if self.report_due is not None and self._clock() >= self.report_due:
            self.report()

    def report_in(self) -> float | None:
        """Seconds until the count of suppressed lines is to be logged; None when there is none."""
        return None if self.report_due is None else max(0.0, self.report_due - self._clock())

    def report(self) -> None:
        """Log how many lines were suppressed since the last report, if any."""
        count, self.suppressed, self.report_due = self.suppressed, 0, None
        if count:
            log.warning("upstream.stderr_suppressed", upstream=self.upstream, count=count)


def _decode(head: bytes, *, cut: bool) -> str:
    if not cut:
        return head.decode("utf-8", errors="replace")
    # A cut may fall inside a character: leave its first bytes out rather than show a replacement character.
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head, final=False)


async def pump_stderr(stream: asyncio.StreamReader, sink: StderrLog) -> None:
    """Read ``stream`` to its end in bounded chunks, handing each line to ``sink``; see the module's notes."""
    lines = _Lines(sink)
    unyielded = 0
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                wait = sink.report_in()
                async with asyncio.timeout_at(None if wait is None else loop.time() + wait):
                    chunk = await stream.read(CHUNK_BYTES)
            except TimeoutError:  # suppressed lines are waiting to be counted, and the child went quiet
                sink.report()
                continue
            except (OSError, ValueError):  # the pipe broke; what the child wrote so far is all there is
                chunk = b""
            if not chunk:
                break
            lines.feed(chunk)
            sink.report_if_due()
            # read() does not wait while the stream has data buffered: without this, a child that writes faster
            # than its lines are handled would keep this task running and every other one waiting.
            unyielded += len(chunk)
            if unyielded >= YIELD_BYTES:
                unyielded = 0
                await asyncio.sleep(0)
        lines.end()
    finally:  # the end of the stream, or the upstream closing: the count is not left untold
        sink.report()


class _Lines:
    """Splits chunks into lines, keeping of each only the first ``sink.max_line_bytes`` and its length."""

    def __init__(self, sink: StderrLog) -> None:
        self._sink = sink
        self._limit = sink.max_line_bytes
        self._head = bytearray()  # the first ``limit`` bytes of the line being read
        self._size = 0  # the length of the line being read so far

    def feed(self, chunk: bytes) -> None:
        start, end = 0, len(chunk)
        while start < end:
            newline = chunk.find(b"\n", start)
            stop = end if newline < 0 else newline
            self._add(chunk, start, stop)
            if newline < 0:
                return
            logged = self._sink.line(bytes(self._head), self._size)
            self._head.clear()
            self._size = 0
            start = newline + 1
            if not logged:
                # The bucket is empty: the rest of the chunk's whole lines are counted at C speed, not split.
                last = chunk.rfind(b"\n", start)
                if last >= 0:
                    self._sink.suppress(chunk.count(b"\n", start, last + 1))
                    start = last + 1
                self._add(chunk, start, end)
                return

    def end(self) -> None:
        if self._size:  # the last line had no newline
            self._sink.line(bytes(self._head), self._size)
            self._head.clear()
            self._size = 0

    def _add(self, chunk: bytes, start: int, stop: int) -> None:
        room = self._limit - len(self._head)
        if room > 0:
            self._head += chunk[start:min(stop, start + room)]
        self._size += stop - start
