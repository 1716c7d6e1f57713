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
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import Processor

from bastion.errors import ConfigError

__all__ = ["LogFormat", "configure_logging"]

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
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
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


def _drop_color_message(_: Any, __: str, event_dict: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """uvicorn attaches an ANSI-coloured duplicate of its message as an ``extra``; it is noise in both formats."""
    event_dict.pop("color_message", None)
    return event_dict
