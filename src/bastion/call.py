"""The call model: what one ``tools/call`` is, what is recorded of it, and the shapes of the steps around it.

Pure data and protocols, imported by the pipeline that runs a call (``bastion.pipeline``), by every guard, by the
audit hook and by tracing; it knows none of them. A ``CallContext`` is what a guard may base a decision on
(immutable); a ``CallRecord`` is what happened, annotated by the guards as the call goes; ``Outcome`` is the one
word the audit record and the call's span keep of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar

from bastion.outcome import Outcome
from bastion.principal import Principal
from bastion.tool_entry import ToolEntry

__all__ = ["ApprovalRound", "AskClient", "AuditHook", "CallContext", "CallRecord", "Era", "Forward", "Handoff",
           "Outcome", "RequestGuard", "ResponseGuard"]

T = TypeVar("T")

Era = Literal["legacy", "modern"]
# Sends a request to the calling client and returns its result (method, params, timeout in seconds); raises a
# ``ProtocolError`` when the client cannot be asked or does not answer.
AskClient = Callable[[str, dict[str, Any], float], Awaitable[dict[str, Any]]]


class CallContext(NamedTuple):
    """Everything a guard may base a decision on. Immutable: guards annotate the ``CallRecord`` instead.

    ``request_id`` is bastion's own id for the call, unique per gateway (the audit record's ``call_id``);
    ``client_id`` is the JSON-RPC id the client sent (the audit record's ``request_id``).

    A named tuple rather than a frozen dataclass: one is built per call, and a frozen dataclass sets each of its
    eleven fields through ``object.__setattr__`` (about 4 µs against 1.5 µs, built with keywords as bastion
    builds it). Change a field with ``_replace``.
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


class Handoff(Generic[T]):
    """A typed place on a ``CallRecord`` for what one guard decides and a later guard acts on.

    The feature declares its own key (``ratelimit.model.ALLOWANCE``: the limits the policy attached to the call;
    ``policy.model.APPROVAL``: the approve rule holding it), so the call model needs none of the features' types.
    ``record.put(KEY, value)``; ``record.get(KEY)`` is the key's default until a guard put a value.
    """

    __slots__ = ("default", "name")

    def __init__(self, name: str, default: T) -> None:
        self.name = name
        self.default = default

    def __repr__(self) -> str:
        return f"Handoff({self.name!r})"


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
    # What went wrong that is not the call's own outcome (a guard that failed unexpectedly): kept in the record.
    audit_error: str | None = None
    # What the approval guard records of an approval (id, outcome, channel, by whom, how long it waited) for the
    # audit record.
    approval: dict[str, Any] | None = None
    # 2026-07-28: the elicitation bastion asks the client in an ``input_required`` result instead of forwarding.
    approval_question: dict[str, Any] | None = None
    # What one guard leaves for a later one (see ``Handoff``): carried here, not recomputed, so both act on one
    # decision.
    handoffs: dict[Handoff[Any], Any] = field(default_factory=dict)

    def put(self, key: Handoff[T], value: T) -> None:
        self.handoffs[key] = value

    def get(self, key: Handoff[T]) -> T:
        value: T = self.handoffs.get(key, key.default)
        return value


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


class AuditHook(Protocol):
    """Writes the one audit record of a call. May raise ``AuditUnavailable`` when audit is required."""

    async def __call__(self, ctx: CallContext, record: CallRecord, outcome: Outcome,
                       result: dict[str, Any] | None, total_ms: float, *,
                       error: BaseException | None = None) -> None: ...


Forward = Callable[[CallContext, CallRecord], Awaitable[dict[str, Any]]]
