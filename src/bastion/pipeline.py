"""The tools/call pipeline: a flat, two-phase list of guards around one forward.

A frozen ``CallContext`` passes the request guards in order (each may raise to stop the call, and may register
clean-up such as releasing a concurrency lease on the ``AsyncExitStack``), then the forward to the upstream, then
the response guards in order (each may transform the result). Whatever happens, the runner writes exactly one
audit record from the ``CallRecord`` that guards annotate along the way.

A flat list rather than an onion of middlewares: every guard visibly runs, the whole order fits on one screen,
and no guard can forget to call the next one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import structlog

from bastion.errors import INTERNAL_ERROR, AuditUnavailable, ProtocolError, RequestError, ToolError, UpstreamTimeout
from bastion.policy.model import ApprovalSpec
from bastion.principal import Principal
from bastion.ratelimit.model import ConcurrencySpec, RateLimitSpec
from bastion.tool import ToolEntry
from bastion.tracing import NO_TRACING, Tracing

log = structlog.get_logger("bastion.pipeline")

Era = Literal["legacy", "modern"]
# Sends a request to the calling client and returns its result (method, params, timeout in seconds); raises a
# ``ProtocolError`` when the client cannot be asked or does not answer.
AskClient = Callable[[str, dict[str, Any], float], Awaitable[dict[str, Any]]]
# Stages are the guards' names plus these; kept as plain strings so a new guard needs no edit here.
STAGES = ("parse", "resolve", "quarantine", "policy", "approval", "ratelimit", "input_schema", "forward",
          "result_shape", "output_schema",
          "sanitize", "complete")


@dataclass(frozen=True, slots=True)
class CallContext:
    """Everything a guard may base a decision on. Immutable: guards annotate the ``CallRecord`` instead.

    ``request_id`` is bastion's own id for the call, unique per gateway (the audit record's ``call_id``);
    ``client_id`` is the JSON-RPC id the client sent (the audit record's ``request_id``).
    """

    request_id: str
    principal: Principal
    tool: ToolEntry
    arguments: dict[str, Any]
    era: Era = "legacy"
    session_id: str | None = None
    client_info: dict[str, Any] | None = None
    traceparent: str | None = None
    client_id: str | int | None = None
    # How to ask the calling client something mid-call (elicitation for approvals); None when it cannot be.
    ask_client: AskClient | None = None
    # 2026-07-28: the approval round this request continues (see ``ApprovalRound``); None for a first request.
    approval_round: ApprovalRound | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRound:
    """What a stateless (2026-07-28) request says about bastion's own approval question.

    ``can_ask``: the client declared elicitation, so it can be asked through an ``input_required`` result.
    ``asked_rule``: the verified ``requestState`` carried bastion's question for this rule, and ``answer`` is the
    client's ``inputResponses`` entry for it. ``approved_rule``: an earlier round of this request was approved.
    """

    can_ask: bool = False
    asked_rule: str | None = None
    answer: dict[str, Any] | None = None
    approved_rule: str | None = None


@dataclass(slots=True)
class CallRecord:
    """What happened to one call, filled in as it goes; the audit record is built from it.

    Guards add facts under their own names: ``rule_id`` (policy), ``limit`` (rate limit), ``violations``
    (schemas), ``sanitize`` (classes and counts), ``shadow`` (rules that would have denied).
    """

    stage: str = "policy"
    decision: Literal["allow", "deny", "error"] = "allow"
    rule_id: str | None = None
    reason: str | None = None
    limit: str | None = None
    violations: list[str] = field(default_factory=list)
    shadow: list[str] = field(default_factory=list)
    sanitize: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    upstream_ms: float | None = None
    # Set by the policy guard for the rate-limit guard: the limits attached to the rules that allowed the call,
    # and the tool's cost weight. Carried here (not recomputed) so both guards see one decision.
    limits: tuple[RateLimitSpec, ...] = ()
    concurrency: tuple[ConcurrencySpec, ...] = ()
    cost: int = 1
    # What went wrong that is not the call's own outcome (a guard that failed unexpectedly): kept in the record.
    audit_error: str | None = None
    # Set by the policy guard when an ``effect: approve`` rule holds the call; ``approval`` is what the approval
    # guard records of it (id, outcome, channel, by whom, how long it waited) for the audit record.
    approval_spec: ApprovalSpec | None = None
    approval: dict[str, Any] | None = None
    # 2026-07-28: the elicitation bastion asks the client in an ``input_required`` result instead of forwarding.
    approval_question: dict[str, Any] | None = None


class RequestGuard(Protocol):
    """Runs before the forward. Raise a ``RequestError`` to stop the call; push clean-up onto ``cleanup``."""

    name: str

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None: ...


class ResponseGuard(Protocol):
    """Runs after the forward, on a result the upstream returned (JSON object of a ``CallToolResult``).

    Returns the (possibly transformed) result, or raises a ``RequestError`` to withhold it.
    """

    name: str

    async def apply(self, ctx: CallContext, result: dict[str, Any], record: CallRecord) -> dict[str, Any]: ...


Outcome = Literal["allowed", "denied", "rate_limited", "invalid_input", "invalid_output", "upstream_error",
                  "timeout", "client_disconnected", "error", "malformed_result"]

# Which outcome a stop at each stage means when the stopping error does not say more.
_STAGE_OUTCOME: dict[str, Outcome] = {
    "resolve": "denied", "quarantine": "denied", "policy": "denied", "approval": "denied", "ratelimit": "rate_limited",
    "input_schema": "invalid_input", "forward": "upstream_error", "output_schema": "invalid_output",
    "sanitize": "denied", "result_shape": "malformed_result",
}


class AuditHook(Protocol):
    """Writes the one audit record of a call. May raise ``AuditUnavailable`` when audit is required."""

    async def __call__(self, ctx: CallContext, record: CallRecord, outcome: Outcome,
                       result: dict[str, Any] | None, total_ms: float, *,
                       error: BaseException | None = None) -> None: ...


Forward = Callable[[CallContext, CallRecord], Awaitable[dict[str, Any]]]


class Pipeline:
    """Runs the guards around one forward and writes exactly one audit record per call, whatever happens."""

    def __init__(self, request_guards: Sequence[RequestGuard], response_guards: Sequence[ResponseGuard],
                 audit: AuditHook) -> None:
        self.request_guards = tuple(request_guards)
        self.response_guards = tuple(response_guards)
        self.audit = audit
        # A span per stage when tracing is on (the app assigns it); the no-op costs a method call per stage.
        self.tracing: Tracing = NO_TRACING

    async def run(self, ctx: CallContext, forward: Forward) -> dict[str, Any]:
        record = CallRecord()
        started = time.perf_counter()
        outcome: Outcome = "allowed"
        result: dict[str, Any] | None = None
        failure: RequestError | None = None
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
            outcome = _STAGE_OUTCOME.get(record.stage, "error")
            record.decision = "deny" if outcome in ("denied", "rate_limited", "invalid_input") else "error"
            record.reason = record.reason or exc.message
            result = exc.to_result()
        except UpstreamTimeout as exc:
            outcome, record.decision, record.reason = "timeout", "error", exc.message
            failure = exc
        except RequestError as exc:
            outcome = _STAGE_OUTCOME.get(record.stage, "error")
            record.decision = "deny" if outcome in ("denied", "rate_limited") else "error"
            record.reason = record.reason or exc.message
            failure = exc
        except asyncio.CancelledError:
            outcome, record.decision = "client_disconnected", "error"
            record.reason = record.reason or "call cancelled by the client"
            if traced:
                tracing.call_outcome(ctx, record, outcome)
            await self._audit(ctx, record, outcome, None, started)
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
