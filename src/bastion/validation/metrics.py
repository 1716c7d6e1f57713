"""The seam between validation and the metrics module: a small protocol the guards report outcomes to."""

from __future__ import annotations

from typing import Literal, Protocol

Direction = Literal["input", "output"]
# pass: valid; reject: refused (input) or withheld (strict output); warn: violating output passed on; skip: not
# checked (mode off, isError result, or no outputSchema).
Outcome = Literal["pass", "reject", "warn", "skip"]


class ValidationMetrics(Protocol):
    """Implemented by the metrics module, e.g. as a Prometheus counter
    ``bastion_schema_validations_total{direction, upstream, tool, outcome}``."""

    def validated(self, direction: Direction, upstream: str, tool: str, outcome: Outcome) -> None: ...

    def quarantined(self, upstream: str, tool: str) -> None: ...


class NoMetrics:
    """Default when no metrics are wired."""

    def validated(self, direction: Direction, upstream: str, tool: str, outcome: Outcome) -> None:
        return None

    def quarantined(self, upstream: str, tool: str) -> None:
        return None
