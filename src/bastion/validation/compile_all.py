"""Compile the validators of a whole catalogue version at once; the core swaps the result in whole."""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from bastion.tool_entry import ToolEntry
from bastion.validation.compile import SchemaRejected, ToolValidators, compile_tool
from bastion.validation.limits import SchemaLimits
from bastion.validation.metrics import NoMetrics, ValidationMetrics

log = structlog.get_logger("bastion.validation")


def compile_catalogue(entries: Iterable[ToolEntry], limits: SchemaLimits, *,
                      metrics: ValidationMetrics | None = None,
                      ) -> tuple[dict[str, ToolValidators], dict[str, str]]:
    """Return ``(validators by public name, quarantine reasons by public name)``.

    Compiles from ``upstream_definition`` (what the upstream declared, before renaming or sanitizing). A tool in
    the second mapping must not be offered to clients nor called.
    """
    sink: ValidationMetrics = metrics or NoMetrics()
    compiled: dict[str, ToolValidators] = {}
    quarantined: dict[str, str] = {}
    for entry in entries:
        try:
            compiled[entry.public_name] = compile_tool(entry.upstream_definition, limits)
        except SchemaRejected as exc:
            quarantined[entry.public_name] = exc.reason
            sink.quarantined(entry.upstream, entry.original_name)
            log.warning("validation.tool_quarantined", upstream=entry.upstream, tool=entry.original_name,
                        reason=exc.reason)
    return compiled, quarantined
