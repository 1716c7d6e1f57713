"""``CallAuditor``: the pipeline's audit hook, turning a finished call into one record, metrics, and an emit.

The pipeline calls it exactly once per call, before the answer goes back (see ``bastion.audit.log`` for why the
order matters when audit is required).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from bastion.audit.log import AuditLog
from bastion.audit.record import as_outcome, call_record, call_verdict, fallback_call_record, record_stage
from bastion.call import CallContext, CallRecord
from bastion.metrics import Metrics

__all__ = ["CallAuditor"]

_log = structlog.get_logger("bastion.audit")


class CallAuditor:
    """Implements ``bastion.call.AuditHook``.

    ``redact`` is applied to every string of logged arguments (only when ``audit.log_arguments`` is on); the core
    passes the sanitizer's redactor. ``clock`` gives wall-clock epoch seconds for the record's ``time``.
    """

    def __init__(self, audit: AuditLog, *, metrics: Metrics | None = None,
                 redact: Callable[[str], str] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.audit = audit
        self.metrics = metrics
        self.redact = redact
        self._clock = clock

    async def __call__(self, ctx: CallContext, record: CallRecord, outcome: str, result: dict[str, Any] | None,
                       total_ms: float, *, error: BaseException | None = None) -> None:
        """``error``, when the pipeline passes the exception that ended the call, fills the record's ``error``
        object and refines the outcome (``upstream_unavailable`` vs ``upstream_error``, ``limiter_unavailable``)."""
        audit = self.audit
        if not audit.sinks and not audit.listeners:
            # Audit is off (``audit.sinks: []``) and no console watches: the record would be built for nobody, at
            # about a tenth of a forwarded call's CPU. The metrics count the same outcome it would have carried.
            if self.metrics is not None:
                try:
                    out, decision = call_verdict(record, None if error is not None else as_outcome(outcome), error)
                    self._observe(self.metrics, ctx, record, out, decision, record_stage(record), total_ms)
                except Exception:
                    _log.error("audit.metrics_failed", exc_info=True)
            return
        started_at = self._clock() - total_ms / 1000
        try:
            doc = call_record(ctx, record, started_at=started_at, total_ms=total_ms,
                              outcome=None if error is not None else as_outcome(outcome), error=error,
                              result=result, log_arguments=self.audit.log_arguments, redact=self.redact)
        except Exception as exc:
            # Never expected (every builder step is total); if one is not, the call is still recorded.
            _log.error("audit.record_failed", error=type(exc).__name__, exc_info=True)
            doc = fallback_call_record(ctx, record, started_at=started_at, total_ms=total_ms,
                                       outcome=as_outcome(outcome), problem=f"{type(exc).__name__}: {exc}"[:512])
        if self.metrics is not None:
            try:
                self._observe(self.metrics, ctx, record, doc["outcome"], doc["decision"], doc["stage"],
                              doc["latency_ms"]["total"])
            except Exception:
                _log.error("audit.metrics_failed", exc_info=True)
        await audit.emit(doc)

    @staticmethod
    def _observe(metrics: Metrics, ctx: CallContext, record: CallRecord, out: str, decision: str, stage: str,
                 total_ms: float) -> None:
        up_ms = record.upstream_ms
        metrics.observe_call(tool=ctx.tool.public_name, upstream=ctx.tool.upstream, decision=decision,
                             stage=stage, total_s=total_ms / 1000,
                             upstream_s=None if up_ms is None else up_ms / 1000)
        if stage == "policy" and decision == "deny":
            metrics.policy_denied(record.rule_id)
        if out == "rate_limited" and record.limit:
            metrics.ratelimit_rejected(record.limit)
        elif out == "invalid_input":
            metrics.validation_action("input", "rejected")
        elif out == "invalid_output":
            metrics.validation_action("output", "rejected")
        if record.sanitize:
            metrics.sanitize_counts(record.sanitize)
