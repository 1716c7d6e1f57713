"""The response guard: sanitize every ``tools/call`` result before it leaves bastion."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import structlog

from bastion.call import CallContext, CallRecord
from bastion.errors import ToolError
from bastion.outcome import Outcome
from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.result import sanitize_result

log = structlog.get_logger("bastion.sanitize")

# Called once per call that had any action, with the upstream, the upstream-side tool name and the counts
# (``class -> n``). The metrics module turns it into ``bastion_sanitize_actions_total{upstream,tool,class}``.
CountsHook = Callable[[str, str, Mapping[str, int]], None]


class ResultWithheld(ToolError):
    """The sanitized result may not reach the client (``injection: block``, or structured output too large)."""

    outcome: ClassVar[Outcome | None] = "denied"


class SanitizeGuard:
    name = "sanitize"

    def __init__(self, config: SanitizeConfig, *, on_counts: CountsHook | None = None) -> None:
        self._config = config
        self._on_counts = on_counts

    async def apply(self, ctx: CallContext, result: dict[str, Any], record: CallRecord) -> dict[str, Any]:
        policy = self._config.for_tool(ctx.tool.upstream, ctx.tool.original_name)
        if not policy.enabled:
            return result
        sanitized, report = sanitize_result(result, policy)
        if report.counts:
            for key, n in report.counts.items():
                record.sanitize[key] = record.sanitize.get(key, 0) + n
            if self._on_counts is not None:
                self._on_counts(ctx.tool.upstream, ctx.tool.original_name, report.counts)
            if report.injection:
                log.warning("sanitize_injection_suspected", request_id=ctx.request_id, tool=ctx.tool.public_name,
                            action=policy.injection,
                            markers=sorted(k for k in report.counts if k.startswith("injection:")))
        if report.withheld is not None:
            raise ResultWithheld(report.withheld, log_detail=f"sanitize counts: {report.counts}")
        return sanitized
