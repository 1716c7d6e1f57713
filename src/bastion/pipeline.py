"""The tools/call pipeline: a flat, two-phase list of guards around one forward.

A frozen ``CallContext`` passes the request guards in order (each may raise to stop the call, and may register
clean-up such as releasing a concurrency lease on the ``AsyncExitStack``), then the forward to the upstream, then
the response guards in order (each may transform the result). Whatever happens, the runner writes exactly one
audit record from the ``CallRecord`` that guards annotate along the way.

A flat list rather than an onion of middlewares: every guard visibly runs, the whole order fits on one screen,
and no guard can forget to call the next one.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from bastion.principal import Principal
from bastion.ratelimit.model import ConcurrencySpec, RateLimitSpec
from bastion.tool import ToolEntry

Era = Literal["legacy", "modern"]
Stage = Literal["policy", "ratelimit", "input_schema", "forward", "output_schema", "sanitize", "pinning",
                "complete"]


@dataclass(frozen=True, slots=True)
class CallContext:
    """Everything a guard may base a decision on. Immutable: guards annotate the ``CallRecord`` instead."""

    request_id: str
    principal: Principal
    tool: ToolEntry
    arguments: dict[str, Any]
    era: Era = "legacy"
    session_id: str | None = None
    client_info: dict[str, Any] | None = None
    traceparent: str | None = None


@dataclass(slots=True)
class CallRecord:
    """What happened to one call, filled in as it goes; the audit record is built from it.

    Guards add facts under their own names: ``rule_id`` (policy), ``limit`` (rate limit), ``violations``
    (schemas), ``sanitize`` (classes and counts), ``shadow`` (rules that would have denied).
    """

    stage: Stage = "policy"
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
