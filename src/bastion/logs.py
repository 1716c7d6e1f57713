"""Operational logging: structlog, human-friendly console output in development, JSON lines in production, on stderr.

Logs go to **stderr**; audit records go to their sinks (stdout by default). The two streams never mix, so a
collector can route them separately without parsing, and an audit pipeline reading stdout never sees a log line.

stdlib logging (uvicorn, httpx, redis) is routed through the same renderer via ``ProcessorFormatter``, so one
process emits one format. The core runs uvicorn with ``log_config=None`` so uvicorn keeps this configuration.
``configure_logging`` is the one place bastion touches global logging state; the CLI calls it once at start with
the ``logging:`` section the settings loader parsed (``BASTION_LOG_FORMAT`` / ``BASTION_LOG_LEVEL`` override it).
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import ExcInfo, Processor

from bastion.errors import ConfigError
from bastion.pipes import NoWait, write_all
from bastion.terminal import printable, printable_lines

__all__ = ["LogFormat", "PipeHandler", "configure_cli_logging", "configure_logging", "escape_for_terminal"]

LogFormat = Literal["console", "json"]
_LEVELS = ("debug", "info", "warning", "error", "critical")
# uvicorn installs its own handlers on these unless told otherwise; clear them so records reach ours once.
_THIRD_PARTY = ("uvicorn", "uvicorn.error", "uvicorn.access", "httpx", "httpcore", "redis")


def configure_logging(format: LogFormat, level: str = "info", *, stream: TextIO | None = None) -> None:
    """Configure structlog and stdlib logging to render ``format`` at ``level`` and above on ``stream`` (stderr)."""
    if level.lower() not in _LEVELS:
        raise ConfigError(f"invalid log level {level!r}", path="logging.level")
    numeric = logging.getLevelNamesMapping()[level.upper()]
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    renderer: Processor
    if format == "json":
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=(stream or sys.stderr).isatty())
        # A traceback as text (the plain one ConsoleRenderer would print), its messages escaped.
        shared += [_FORMAT_EXC_INFO, escape_for_terminal]

    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.ExtraAdder(), _drop_color_message, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = _handler(stream)
    handler.setFormatter(formatter)
    # Fields of a stdlib record that neither renderer prints (the formatter renders the event dict, and its format
    # string is "%(message)s"): finding the caller's source line walks the stack, and each of the others is a
    # call per line. About 40% of the CPU of a log line (50 to 30 us), with identical output (tests/test_logs.py).
    logging._srcfile = None  # the switch logging's HOWTO documents for this
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in _THIRD_PARTY:
        lg = logging.getLogger(name)
        for old in list(lg.handlers):
            lg.removeHandler(old)
        lg.propagate = True
    # httpx logs every request at INFO; that is a debug concern for a gateway forwarding thousands of them.
    logging.getLogger("httpx").setLevel(max(numeric, logging.WARNING))


def _handler(stream: TextIO | None) -> logging.Handler:
    """stderr's descriptor, written without ever waiting (``PipeHandler``); a stream a caller passes (or a stderr
    without a descriptor, as under a test runner's capture) through logging's own handler."""
    if stream is None:
        try:
            sys.stderr.flush()
            return PipeHandler(sys.stderr.fileno())
        except (OSError, ValueError):  # io.UnsupportedOperation is both
            pass
    return logging.StreamHandler(stream if stream is not None else sys.stderr)


class PipeHandler(logging.Handler):
    """Log lines to a descriptor another process drains (stderr), never waiting in the thread that logs.

    In a container stderr is a pipe to the log agent, and a plain handler's ``write`` blocks when the agent stalls
    and the pipe fills: on the event loop, that stops the gateway (``bastion.pipes``). Here a line is written at
    once when the pipe has room; otherwise it joins a backlog that a thread writes as room appears, and every line
    after it follows (order kept, lines whole). Logs are best effort: past ``max_backlog`` bytes, whole lines are
    dropped and counted, and once the pipe drains a ``logs.dropped`` line says how many. Where the descriptor
    cannot be written without waiting (a regular file, a terminal) each line is written as ``StreamHandler``
    would.
    """

    def __init__(self, fd: int, *, max_backlog: int = 1 << 20) -> None:
        super().__init__()
        self._nowait = NoWait(fd)
        self._max_backlog = max_backlog
        self._backlog: deque[bytes] = deque()
        self._backlog_bytes = 0
        self._busy = False  # the writer thread holds lines taken from the backlog
        self._dropped = 0
        self._closed = False
        self._wake = threading.Condition(threading.Lock())
        self._writer: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
            self._put(data)
        except Exception:
            self.handleError(record)

    def _put(self, data: bytes) -> None:
        with self._wake:
            if not self._backlog and not self._busy:
                written = self._nowait.write(data)
                if written is None:
                    write_all(self._nowait.fd, data)
                    return
                if written == len(data) or self._closed:  # closed: no writer left to finish a line
                    return
                data = data[written:]  # the rest of a line the pipe took part of: never dropped
            elif self._closed or self._backlog_bytes + len(data) > self._max_backlog:
                self._dropped += 1
                return
            self._backlog.append(data)
            self._backlog_bytes += len(data)
            if self._writer is None:
                self._writer = threading.Thread(target=self._drain, name="bastion-log-writer", daemon=True)
                self._writer.start()
            self._wake.notify()

    def _drain(self) -> None:
        while True:
            with self._wake:
                while not self._backlog and not self._closed:
                    self._wake.wait()
                if not self._backlog:
                    return
                chunk = b"".join(self._backlog)
                self._backlog.clear()
                self._backlog_bytes = 0
                self._busy = True
            try:
                write_all(self._nowait.fd, chunk)
                dropped = 0
                with self._wake:
                    if not self._backlog:  # caught up: say what was lost meanwhile
                        dropped, self._dropped = self._dropped, 0
                if dropped:
                    write_all(self._nowait.fd, self._dropped_line(dropped))
            except OSError:
                return  # the reader is gone for good (EPIPE): nothing more can be written
            finally:
                with self._wake:
                    self._busy = False

    def _dropped_line(self, count: int) -> bytes:
        record = logging.LogRecord("bastion.logs", logging.WARNING, __file__, 0, "logs.dropped", None, None)
        record.count = count
        record.reason = "the log reader fell behind; lines past the backlog were dropped"
        return (self.format(record) + "\n").encode("utf-8", "backslashreplace")

    def close(self) -> None:
        """Let the writer finish the backlog for up to two seconds (a reader that never comes back does not
        hold the process), then close."""
        with self._wake:
            self._closed = True
            self._wake.notify()
            writer = self._writer
        if writer is not None:
            writer.join(2.0)
        super().close()


def _drop_color_message(_: Any, __: str, event_dict: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """uvicorn attaches an ANSI-coloured duplicate of its message as an ``extra``; it is noise in both formats."""
    event_dict.pop("color_message", None)
    return event_dict


def configure_cli_logging() -> None:
    """The log of an admin command (``bastion pins approve`` logs ``pin.approved``): console lines on stderr,
    escaped, without colours; stdout stays the command's output."""
    structlog.configure(
        processors=[structlog.stdlib.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
                    _FORMAT_EXC_INFO, escape_for_terminal,
                    structlog.dev.ConsoleRenderer(colors=False)],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def _traceback(exc_info: ExcInfo) -> str:
    """The plain traceback ``ConsoleRenderer`` prints, with each exception's message (and notes) escaped to one
    line: a message holding a newline would otherwise print a line of its own under the traceback."""
    top = traceback.TracebackException(*exc_info)
    todo, seen = [top], set()
    while todo:
        exc = todo.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        setattr(exc, "format_exception_only", _escaped_only(exc.format_exception_only))  # noqa: B010
        todo += [e for e in (exc.__cause__, exc.__context__) if e is not None]
        todo += exc.exceptions or []
    return "".join(top.format()).rstrip("\n")


def _escaped_only(only: Callable[..., Iterator[str]]) -> Callable[..., Iterator[str]]:
    def escaped(*args: Any, **kwargs: Any) -> Iterator[str]:
        for chunk in only(*args, **kwargs):
            yield printable(chunk.removesuffix("\n")) + "\n"

    return escaped


_FORMAT_EXC_INFO = structlog.processors.ExceptionRenderer(_traceback)
_PLAIN = (int, float, bool, type(None))
_MULTILINE = ("exception", "stack")  # rendered on the lines after the entry: their newlines are structure
_META = ("_record", "_from_structlog")  # ProcessorFormatter's own, removed before rendering


class _Shown:
    """A value ``escape_for_terminal`` has escaped: the console renderer prints its ``repr``, which is the text."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def escape_for_terminal(_: Any, __: str, event_dict: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """The console format's escaping (``bastion.terminal``): no key or value reaches the terminal with a control,
    format or line-breaking character in it; tool names, upstream errors and stdlib messages are often not ours.

    The console renderer prints a string without quotes unless it holds a space, ``=``, a quote or a line break,
    then as its ``repr``, and every other value as its ``repr``, so: a string with something to escape becomes its
    ``repr`` (quoted, each character escaped once, a ``key=value`` inside it cannot pass as a field of its own), as
    does such a key; the event name (a column of its own) is written escaped; other values keep their ``repr``
    when it is printable. The ``exception`` and ``stack`` texts keep their newlines (``_traceback`` has escaped
    each message). Already escaped text (``upstream.stderr`` lines) is left as it is. The JSON format needs none
    of this: its renderer (``json.dumps``, ASCII) escapes every character but printable ASCII.
    """
    for key, value in event_dict.items():
        if type(key) is not str or not key.isprintable():
            break
        if key in _META:
            continue
        if type(value) is str:
            if not value.isprintable() and (key not in _MULTILINE or printable_lines(value) != value):
                break
        elif not isinstance(value, _PLAIN):
            break
    else:
        return event_dict  # the common case: all keys and strings printable, values plain
    out: structlog.typing.EventDict = {}
    for key, value in event_dict.items():
        name = key if isinstance(key, str) and key.isprintable() else printable(repr(key))
        if isinstance(value, str):
            if key in _MULTILINE:
                out[name] = printable_lines(value)
            elif value.isprintable():
                out[name] = value
            elif key == "event":  # its own column, printed as it is
                out[name] = printable(value)
            else:
                out[name] = _Shown(repr(value))
        elif isinstance(value, _PLAIN) or key in _META:
            out[name] = value
        else:
            text = repr(value)
            out[name] = value if text.isprintable() else _Shown(printable(text))
    return out
