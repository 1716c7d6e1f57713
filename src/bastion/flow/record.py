"""Recording what a finished call touched, as a wrapper around the pipeline's audit hook.

Why the audit hook and not a response guard: a touch depends on how the call ended, and only the audit hook
sees every ending exactly once (``touched_on: any`` must count a forwarded call that then timed out or failed
output validation; response guards never run for those), together with the sanitize findings and the
``call_id`` the touch cites. The pipeline awaits the hook before the answer goes back, so by the time a client
has a result, the touch it caused is in the store and the client's next call is decided on it.

Concurrent calls of one context are not ordered: a call decided while an earlier one is still running does not
see that earlier call's touches (a client that wants the guarantee waits for each answer, as agents do).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from bastion.call import AuditHook, CallContext, CallRecord, Outcome
from bastion.flow.context import context_key
from bastion.flow.store import FlowStore
from bastion.policy.decide import PolicySet
from bastion.policy.flow import touches_for

log = structlog.get_logger("bastion.flow")

__all__ = ["FlowRecorder"]


class FlowRecorder:
    """Implements ``AuditHook``: adds the call's touches to its context, then hands the call to ``inner``.

    Recording never fails a call: a store failure is logged (the next decision that needs the history finds the
    store failing too, and fails closed).
    """

    def __init__(self, inner: AuditHook, policy: Callable[[], PolicySet], store: FlowStore, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._inner = inner
        self._policy = policy
        self._store = store
        self._clock = clock

    async def __call__(self, ctx: CallContext, record: CallRecord, outcome: Outcome,
                       result: dict[str, Any] | None, total_ms: float, *,
                       error: BaseException | None = None) -> None:
        try:
            await self._record(ctx, record, outcome, result)
        except Exception as exc:
            log.error("flow.record_failed", error=type(exc).__name__, tool=ctx.tool.public_name[:200])
        await self._inner(ctx, record, outcome, result, total_ms, error=error)

    async def _record(self, ctx: CallContext, record: CallRecord, outcome: Outcome,
                      result: dict[str, Any] | None) -> None:
        policy = self._policy()
        if not policy.has_flow:
            return  # no rule reads history: nothing is worth a write
        succeeded = outcome == "allowed" and result is not None
        watched = policy.watched_labels
        # Only labels some condition reads are kept: the rest could never change a decision.
        labels = {k: v for k, v in policy.labels_of(ctx.tool).items() if k in watched}
        touches = touches_for(
            labels, forwarded=record.upstream_ms is not None, succeeded=succeeded,
            result_returned=succeeded and result is not None and result.get("isError") is not True,
            injection=any(n > 0 for k, n in record.sanitize.items() if k.startswith("injection:")),
            settings=policy.flow, tool=ctx.tool.public_name, at=self._clock(), call_id=ctx.request_id)
        touches = tuple(t for t in touches if t.label in watched)
        if touches:
            context, _ = context_key(ctx)
            await self._store.add(context, touches, retention_s=policy.flow.retention_s,
                                  max_touches=policy.flow.max_touches)
