"""The tools/call pipeline: a flat, two-phase list of guards around one forward.

A frozen ``CallContext`` passes the request guards in order (each may raise to stop the call, and may register
clean-up such as releasing a concurrency lease on the ``AsyncExitStack``), then the forward to the upstream, then
the response guards in order (each may transform the result). Whatever happens, the runner writes exactly one
audit record from the ``CallRecord`` that guards annotate along the way.

A flat list rather than an onion of middlewares: every guard visibly runs, the whole order fits on one screen,
and no guard can forget to call the next one. The runner knows no guard by name: what a stopped call counts as
(its ``Outcome``) is said by the error that stopped it (``RequestError.outcome``, see ``outcome_of``), so a new
guard brings its errors and needs no edit here. The model it runs on (context, record, guard shapes) is
``bastion.call``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import structlog

from bastion.call import AuditHook, CallContext, CallRecord, Forward, Outcome, RequestGuard, ResponseGuard
from bastion.errors import INTERNAL_ERROR, AuditUnavailable, ProtocolError, RequestError, ToolError, UpstreamTimeout
from bastion.tracing import NO_TRACING, Tracing

log = structlog.get_logger("bastion.pipeline")

# Outcomes whose record says the call was refused ("deny") rather than failed ("error").
_REFUSALS: frozenset[Outcome] = frozenset({"denied", "rate_limited", "invalid_input"})


def outcome_of(exc: RequestError, stage: str) -> Outcome:
    """What a call that ``exc`` stopped at ``stage`` counts as: the error's own word when it says one.

    One that says none is an upstream error when the forward raised it (the transports and the multi-round
    handling raise plain protocol and tool errors about the upstream's answer), and an ``error`` anywhere else.
    """
    if exc.outcome is not None:
        return exc.outcome
    return "upstream_error" if stage == "forward" else "error"


def _reason(current: str | None, forwarded: bool, allowed_because: str | None, message: str) -> str:
    """A stopped call's reason: what the guard that stopped it noted, else the error's message. The reason the
    request guards left when the call went forward (why it was allowed) is not one: an upstream that crashed
    mid-call must not be recorded as "allowed by rule ..."."""
    if current is None or (forwarded and current is allowed_because):
        return message
    return current


class Pipeline:
    """Runs the guards around one forward and writes exactly one audit record per call, whatever happens."""

    def __init__(self, request_guards: Sequence[RequestGuard], response_guards: Sequence[ResponseGuard],
                 audit: AuditHook, *, tracing: Tracing = NO_TRACING) -> None:
        self.request_guards = tuple(request_guards)
        self.response_guards = tuple(response_guards)
        self.audit = audit
        # A span per stage when tracing is on; the no-op costs a branch per stage (see ``run``).
        self.tracing = tracing

    async def run(self, ctx: CallContext, forward: Forward) -> dict[str, Any]:
        record = CallRecord()
        started = time.perf_counter()
        outcome: Outcome = "allowed"
        result: dict[str, Any] | None = None
        failure: RequestError | None = None
        # The reason the request guards left (the policy's allow reason): a failure after them says its own.
        forwarded, allowed_because = False, None
        tracing = self.tracing
        # Tested once per stage rather than entering a no-op context manager: off, tracing costs a branch.
        traced = tracing.enabled
        try:
            async with AsyncExitStack() as cleanup:
                for guard in self.request_guards:
                    record.stage = guard.name
                    if traced:
                        with tracing.stage(guard.name):
                            await guard.check(ctx, record, cleanup)
                    else:
                        await guard.check(ctx, record, cleanup)
                record.stage = "forward"
                forwarded, allowed_because = True, record.reason
                sent = time.perf_counter()
                try:
                    if traced:
                        with tracing.stage("forward"):
                            result = await forward(ctx, record)
                    else:
                        result = await forward(ctx, record)
                finally:
                    record.upstream_ms = (time.perf_counter() - sent) * 1000
                # An input_required result (2026-07-28) is a question for the client, not the tool's output:
                # there is no structuredContent to validate yet; the guards see the final answer after the retry.
                if result.get("resultType") != "input_required":
                    for rguard in self.response_guards:
                        record.stage = rguard.name
                        if traced:
                            with tracing.stage(rguard.name):
                                result = await rguard.apply(ctx, result, record)
                        else:
                            result = await rguard.apply(ctx, result, record)
                record.stage = "complete"
        except ToolError as exc:
            # A tool error is an answer, not a failure: the client gets it as an isError result.
            outcome = outcome_of(exc, record.stage)
            record.decision = "deny" if outcome in _REFUSALS else "error"
            record.reason = _reason(record.reason, forwarded, allowed_because, exc.message)
            result = exc.to_result()
        except UpstreamTimeout as exc:
            # The timeout's own message replaces whatever a guard noted: it is what the caller waited for.
            outcome, record.decision, record.reason = "timeout", "error", exc.message
            failure = exc
        except RequestError as exc:
            outcome = outcome_of(exc, record.stage)
            record.decision = "deny" if outcome in _REFUSALS else "error"
            record.reason = _reason(record.reason, forwarded, allowed_because, exc.message)
            failure = exc
        except asyncio.CancelledError:
            outcome, record.decision = "client_disconnected", "error"
            record.reason = record.reason or "call cancelled by the client"
            if traced:
                tracing.call_outcome(ctx, record, outcome)
            try:
                await self._audit(ctx, record, outcome, None, started)
            except AuditUnavailable:
                # Nobody waits for an answer any more, and the cancellation must reach whoever cancelled (a
                # TaskGroup, a timeout): the sink failure is already counted and logged by the audit log.
                log.warning("audit.unavailable_on_cancel", tool=ctx.tool.public_name[:200])
            raise
        except Exception as exc:
            # A guard, the forward or a response guard failed in a way it should not (a bug, or a foreign
            # exception nobody translated). The call still gets its record, and the client a plain internal error.
            log.error("pipeline.failed", stage=record.stage, tool=ctx.tool.public_name[:200],
                      error=type(exc).__name__, exc_info=True)
            outcome, record.decision = "error", "error"
            record.reason = f"internal error in stage {record.stage}"
            record.audit_error = f"{record.stage}: {type(exc).__name__}: {str(exc)[:512]}"
            failure = ProtocolError(INTERNAL_ERROR, "Internal error", log_detail=record.audit_error)
        if outcome == "allowed" and result is not None and result.get("isError") is True:
            record.extra["upstream_is_error"] = True
        if traced:
            tracing.call_outcome(ctx, record, outcome)
        # Audit before answering: with audit.required the hook raises and the caller gets an error instead of
        # a result that was never recorded.
        await self._audit(ctx, record, outcome, result if failure is None else None, started, failure)
        if failure is not None:
            raise failure
        assert result is not None
        return result

    async def _audit(self, ctx: CallContext, record: CallRecord, outcome: Outcome, result: dict[str, Any] | None,
                     started: float, failure: BaseException | None = None) -> None:
        try:
            await self.audit(ctx, record, outcome, result, (time.perf_counter() - started) * 1000, error=failure)
        except AuditUnavailable:
            raise
        except Exception:
            # The hook is total by contract (``CallAuditor`` falls back to a minimal record); if one is not, the
            # answer still goes out and the failure is loud in the log.
            log.error("audit.hook_failed", tool=ctx.tool.public_name[:200], exc_info=True)
