"""The compiled policy: frozen rules as the loader builds them and the decisions the evaluator returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bastion.call import Handoff
from bastion.policy.constraints import ArgConstraint
from bastion.policy.flow import FlowCondition, Touch
from bastion.policy.names import Glob
from bastion.ratelimit.model import ConcurrencySpec, RateLimitSpec

Effect = Literal["allow", "deny", "approve"]
Approver = Literal["user", "admin"]
Remember = Literal["none", "call", "session"]
Mode = Literal["enforce", "shadow"]
Kind = Literal["tool", "prompt", "resource"]

# What a tool that says nothing is assumed to be, per the MCP spec's ToolAnnotations defaults.
ANNOTATION_DEFAULTS: dict[str, Any] = {
    "readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True,
}


@dataclass(frozen=True, slots=True)
class PrincipalMatch:
    """Who a rule is about: anyone listed in ``ids``, OR in one of ``groups``, OR carrying all of ``claims``."""

    ids: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    claims: tuple[tuple[str, tuple[Any, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class ApprovalSpec:
    """What an ``effect: approve`` rule asks for: who may say yes (``via``), how long the call waits for an
    answer, and what one yes covers (``none``/``call``: this call; ``session``: this tool and rule for the rest
    of the client's session)."""

    via: tuple[Approver, ...] = ("user", "admin")
    timeout_s: float = 120.0
    remember: Remember = "none"
    message: str | None = None


# Put on the call's record by the policy guard when an ``effect: approve`` rule holds the call; read by the
# approval guard after it.
APPROVAL: Handoff[ApprovalSpec | None] = Handoff("policy.approval", None)


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule. A ``None`` matcher means "any"; ``kinds`` says which of tools, prompts and resources it governs."""

    id: str
    effect: Effect
    mode: Mode
    origin: str  # "file:line", for explain and logs
    kinds: frozenset[Kind]
    description: str | None = None
    # A denial by a rule with ``when``: the earlier calls that made its condition hold (empty: history unknown).
    flow: tuple[Touch, ...] = ()
    principals: PrincipalMatch | None = None
    tools: tuple[Glob, ...] | None = None
    upstreams: frozenset[str] | None = None
    annotations: tuple[tuple[str, Any], ...] = ()
    arguments: tuple[ArgConstraint, ...] = ()
    prompts: tuple[Glob, ...] | None = None
    resources: tuple[Glob, ...] | None = None
    limits: tuple[RateLimitSpec, ...] = ()
    concurrency: tuple[ConcurrencySpec, ...] = ()
    # Whether a call this rule denies is told so (rule id and description) instead of "unknown tool";
    # None: the policy set's default (``reveal`` at the top of a policy file, else false).
    reveal: bool | None = None
    # Flow: ``labels`` matches tools carrying any of these labels; ``when`` matches on the context's history.
    labels: frozenset[str] | None = None
    when: FlowCondition | None = None
    # effect: approve only: how the approval is obtained.
    approval: ApprovalSpec | None = None

    @property
    def enforced(self) -> bool:
        return self.mode == "enforce"


@dataclass(frozen=True, slots=True)
class CostWeight:
    """Calls to tools matching ``tools`` cost ``weight`` units of every rate limit they count against."""

    tools: tuple[Glob, ...]
    weight: int


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer for one principal and one tool, prompt or resource.

    ``rule_id`` is the deny rule that refused, or the first allow rule that permitted; None for the default deny.
    ``shadow_denies`` lists shadow rules that would have refused, whatever the outcome. ``limits``,
    ``concurrency`` and ``cost`` are for the rate-limit guard and are only filled when the call is allowed.
    ``reveal`` (denials only) says the caller may be told why, with the deciding rule's ``description``.
    """

    allowed: bool
    rule_id: str | None
    reason: str
    shadow_denies: tuple[str, ...] = ()
    limits: tuple[RateLimitSpec, ...] = ()
    concurrency: tuple[ConcurrencySpec, ...] = ()
    cost: int = 1
    reveal: bool = False
    description: str | None = None
    # A denial by a rule with ``when``: the earlier calls that made its condition hold (empty: history unknown).
    flow: tuple[Touch, ...] = ()
    # Set when the call is allowed only once a person approves it (an ``effect: approve`` rule matched);
    # ``rule_id`` is then that rule's.
    approval: ApprovalSpec | None = None
