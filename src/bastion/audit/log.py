"""``AuditLog``: fan one record out to every sink, and decide what a failing sink means.

Use from the core (``required: true`` must fail closed, so the order matters)::

    result = ...                                  # the pipeline produced a result (or an error)
    record = call_record(ctx, call, ...)          # pure
    await audit.emit(record)                      # BEFORE the result is returned to the client
    return result

With ``required: false`` (the default) ``emit`` never raises: a failing sink is logged as ``audit.sink_failed``
(at most once per ``report_interval_s`` per sink, with the count of failures suppressed since) and counted in
``bastion_audit_sink_failures_total{sink}``. With ``required: true`` it raises ``AuditUnavailable`` after trying
every sink, and the core answers that error instead of the result: a call whose record could not be written is
treated as a call that must not have happened. (The upstream has then already run; fail-closed guarantees that
no *result* leaves unaudited, not that no side effect happened. Records for calls stopped before the forward are
emitted the same way, so a required audit also refuses calls it cannot record.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from bastion.audit.sinks import AuditSink, AuditSinkError
from bastion.errors import AuditUnavailable

__all__ = ["AuditLog"]

_log = structlog.get_logger("bastion.audit")


@dataclass(slots=True)
class _FailureState:
    last_report: float | None = None
    suppressed: int = 0
    total: int = 0


class AuditLog:
    """Writes each record to every sink concurrently; see the module docstring for the failure contract.

    ``on_sink_failure`` is called with the sink's name on every failure (the core passes
    ``metrics.audit_sink_failed``); ``clock`` is injectable so the report rate limit is testable without sleeping.
    """

    def __init__(self, sinks: Sequence[AuditSink], *, required: bool = False, log_arguments: bool = False,
                 report_interval_s: float = 60.0, on_sink_failure: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sinks = tuple(sinks)
        self.required = required
        self.log_arguments = log_arguments
        self.report_interval_s = report_interval_s
        self._on_sink_failure = on_sink_failure
        self._clock = clock
        self._failures: dict[str, _FailureState] = {s.name: _FailureState() for s in self.sinks}
        # In-process subscribers (the admin console's live table): called with every record, before the sinks.
        # They must not block; one that raises is logged and skipped, never failing the emit.
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    def failures(self, sink: str) -> int:
        """How many records ``sink`` has failed to write since start."""
        state = self._failures.get(sink)
        return state.total if state is not None else 0

    async def emit(self, record: dict[str, Any]) -> None:
        """Write ``record`` everywhere. Raises ``AuditUnavailable`` only when ``required`` and a sink failed."""
        for listener in self.listeners:
            try:
                listener(record)
            except Exception as exc:
                _log.error("audit.listener_failed", detail=f"{type(exc).__name__}: {exc}")
        if not self.sinks:
            return
        if len(self.sinks) == 1:
            failed = [] if await self._write(self.sinks[0], record) else [self.sinks[0].name]
        else:
            oks = await asyncio.gather(*(self._write(s, record) for s in self.sinks))
            failed = [s.name for s, ok in zip(self.sinks, oks, strict=True) if not ok]
        if failed and self.required:
            raise AuditUnavailable(log_detail=f"audit sinks failed: {', '.join(failed)}")

    async def close(self) -> None:
        for sink in self.sinks:
            await sink.close()

    async def _write(self, sink: AuditSink, record: dict[str, Any]) -> bool:
        try:
            await sink.write(record)
        except AuditSinkError as exc:
            self._failed(sink.name, exc.detail, record)
            return False
        except Exception as exc:
            # A sink bug must not take the gateway down (or, when not required, even one call).
            self._failed(sink.name, f"unexpected {type(exc).__name__}: {exc}", record)
            return False
        return True

    def _failed(self, sink: str, detail: str, record: dict[str, Any]) -> None:
        state = self._failures.setdefault(sink, _FailureState())
        state.total += 1
        if self._on_sink_failure is not None:
            self._on_sink_failure(sink)
        now = self._clock()
        if state.last_report is not None and now - state.last_report < self.report_interval_s:
            state.suppressed += 1
            return
        _log.error("audit.sink_failed", sink=sink, detail=detail, required=self.required,
                   suppressed_since_last=state.suppressed, failures_total=state.total,
                   audit_event=record.get("event"), request_id=record.get("request_id"))
        state.last_report = now
        state.suppressed = 0
