"""The pipeline guards that enforce a tool's ``inputSchema`` before the forward and ``outputSchema`` after it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, ClassVar, Literal

import structlog

from bastion.call import CallContext, CallRecord
from bastion.errors import ToolError
from bastion.outcome import Outcome
from bastion.tool_entry import ToolEntry
from bastion.validation.compile import ToolValidators
from bastion.validation.metrics import NoMetrics, ValidationMetrics
from bastion.validation.report import Report

OutputMode = Literal["strict", "warn", "off"]

log = structlog.get_logger("bastion.validation")

_MISSING_STRUCTURED = "$: missing structuredContent required by the tool's outputSchema"


class InvalidArguments(ToolError):
    """The call's arguments do not match the tool's ``inputSchema`` (or it has none that could be compiled)."""

    outcome: ClassVar[Outcome | None] = "invalid_input"


class OutputRejected(ToolError):
    """The tool's result does not match its ``outputSchema`` (``strict``): withheld."""

    outcome: ClassVar[Outcome | None] = "invalid_output"


def _listing(report: Report) -> str:
    text = "; ".join(report.violations)
    return text + "; (further violations omitted)" if report.truncated else text


class InputSchemaGuard:
    """Refuse a call whose arguments do not match the tool's ``inputSchema``; the upstream never sees it.

    ``validators_for`` returns the tool's compiled validators from the current catalogue version. ``None`` means
    the tool has none (quarantined, or not compiled): the call is refused, never forwarded unvalidated.
    """

    name = "input_schema"

    def __init__(self, validators_for: Callable[[ToolEntry], ToolValidators | None], *,
                 metrics: ValidationMetrics | None = None) -> None:
        self._validators_for = validators_for
        self._metrics: ValidationMetrics = metrics or NoMetrics()

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None:
        tool = ctx.tool
        record.stage = "input_schema"
        validators = self._validators_for(tool)
        if validators is None:
            record.decision = "deny"
            record.reason = "schema_unavailable"
            self._metrics.validated("input", tool.upstream, tool.original_name, "reject")
            raise InvalidArguments(f"Tool {tool.public_name} is unavailable: its schema could not be validated",
                                   log_detail="no compiled validators for this tool (quarantined or not compiled)")
        report = validators.input.validate(ctx.arguments)
        if report.ok:
            self._metrics.validated("input", tool.upstream, tool.original_name, "pass")
            return
        record.decision = "deny"
        record.reason = "invalid_arguments"
        record.violations = list(report.violations)
        self._metrics.validated("input", tool.upstream, tool.original_name, "reject")
        log.info("validation.input_rejected", upstream=tool.upstream, tool=tool.original_name,
                 violations=list(report.violations))
        raise InvalidArguments(f"Invalid arguments for tool {tool.public_name}: {_listing(report)}",
                               structured={"violations": list(report.violations)})


class OutputSchemaGuard:
    """Check ``structuredContent`` against the tool's ``outputSchema`` when it declares one.

    ``strict`` withholds a violating result and replaces it with a tool error naming the violations (never the
    data); ``warn`` passes it on, logged and counted; ``off`` skips the check. Results with ``isError: true`` pass
    untouched: the schema describes successful output only.
    """

    name = "output_schema"

    def __init__(self, validators_for: Callable[[ToolEntry], ToolValidators | None],
                 mode_for: Callable[[ToolEntry], OutputMode], *, metrics: ValidationMetrics | None = None) -> None:
        self._validators_for = validators_for
        self._mode_for = mode_for
        self._metrics: ValidationMetrics = metrics or NoMetrics()

    async def apply(self, ctx: CallContext, result: dict[str, Any], record: CallRecord) -> dict[str, Any]:
        tool = ctx.tool
        mode = self._mode_for(tool)
        validators = self._validators_for(tool)
        output = validators.output if validators is not None else None
        if mode == "off" or output is None or result.get("isError") is True:
            self._metrics.validated("output", tool.upstream, tool.original_name, "skip")
            return result
        record.stage = "output_schema"
        if "structuredContent" not in result:
            report = Report((_MISSING_STRUCTURED,))
        else:
            report = output.validate(result["structuredContent"])
        if report.ok:
            self._metrics.validated("output", tool.upstream, tool.original_name, "pass")
            return result
        record.violations = list(report.violations)
        if mode == "warn":
            self._metrics.validated("output", tool.upstream, tool.original_name, "warn")
            log.warning("validation.output_violation", upstream=tool.upstream, tool=tool.original_name,
                        mode=mode, violations=list(report.violations))
            return result
        record.decision = "error"
        record.reason = "invalid_output"
        self._metrics.validated("output", tool.upstream, tool.original_name, "reject")
        log.warning("validation.output_withheld", upstream=tool.upstream, tool=tool.original_name,
                    violations=list(report.violations))
        raise OutputRejected(f"Tool {tool.public_name} returned a result that does not match its output schema; "
                             f"the result was withheld: {_listing(report)}",
                             structured={"violations": list(report.violations)})
