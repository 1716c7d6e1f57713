"""The policy as the gateway uses it: the ``policy`` request guard and list filtering, from one decision.

Both read the current ``PolicySet`` through one holder that the watcher swaps atomically, so a reload takes
effect for lists and calls at the same instant and the two can never disagree.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from contextlib import AsyncExitStack

from bastion.call import CallContext, CallRecord
from bastion.errors import PolicyDenied, UnknownTool
from bastion.policy.decide import PolicySet
from bastion.policy.flow import FlowHistory, ReadHistory, flow_audit
from bastion.policy.model import APPROVAL, Decision
from bastion.principal import Principal
from bastion.ratelimit.model import ALLOWANCE, Allowance
from bastion.tool_entry import ToolEntry
from bastion.visibility import claims_key


class PolicyHolder:
    """The policy in force. Replaced whole; readers take one reference per request."""

    def __init__(self, initial: PolicySet) -> None:
        self.current = initial

    def swap(self, new: PolicySet) -> None:
        self.current = new


class PolicyAccess:
    """``AccessControl`` backed by the policy: lists show exactly what the caller may call."""

    # A policy can make lists differ per caller, so modern clients are told their lists are private.
    per_principal = True

    def __init__(self, holder: PolicyHolder) -> None:
        self._holder = holder
        # The claim names the policy in force reads, worked out once per policy set.
        self._claims: tuple[PolicySet | None, tuple[str, ...]] = (None, ())

    def tool_visible(self, principal: Principal, entry: ToolEntry) -> bool:
        return self._holder.current.visible(principal, entry)

    def visibility_key(self, principal: Principal) -> tuple[object, Hashable]:
        """What a listing decision reads of ``principal`` under the policy in force (``principal_matches``: its
        id, its groups, the claims rules name), with that policy as the scope a reload replaces."""
        policy = self._holder.current
        if self._claims[0] is not policy:
            names = {name for rule in policy.rules if rule.principals is not None
                     for name, _ in rule.principals.claims}
            self._claims = (policy, tuple(sorted(names)))
        return policy, (principal.id, principal.groups, claims_key(principal.attributes, self._claims[1]))

    def prompt_visible(self, principal: Principal, upstream: str, public_name: str) -> bool:
        return self._holder.current.decide_prompt(principal, upstream, public_name).allowed

    def resource_visible(self, principal: Principal, upstream: str, uri: str) -> bool:
        return self._holder.current.decide_resource(principal, upstream, uri).allowed

    def prompt_allowance(self, principal: Principal, upstream: str, public_name: str) -> Allowance | None:
        return _allowance(self._holder.current.decide_prompt(principal, upstream, public_name))

    def resource_allowance(self, principal: Principal, upstream: str, uri: str) -> Allowance | None:
        return _allowance(self._holder.current.decide_resource(principal, upstream, uri))


def _allowance(decision: Decision) -> Allowance | None:
    # Every method's limits: the forwarded request picks those that count it (``ratelimit.forwarded``).
    return Allowance(decision.limits, decision.concurrency) if decision.allowed else None


class PolicyGuard:
    """Decides the call and hands the limits of the allowing rules to the rate-limit guard.

    A denied call is answered exactly like an unknown tool, so a caller cannot map what exists behind the
    gateway; the audit record keeps the deciding rule. Unless the deciding rule (or the policy set) says
    ``reveal: true``: then the caller is told the rule and its description, with a code of its own.
    """

    name = "policy"

    def __init__(self, holder: PolicyHolder, history: ReadHistory | None = None) -> None:
        self._holder = holder
        # None: no flow store, so a ``when`` rule is decided as on an unreadable history (it holds: fail closed).
        self._history = history

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None:
        policy = self._holder.current
        history: FlowHistory | None = None
        # Only a call some ``when`` rule is about reads the context: every other call costs no store round trip.
        if self._history is not None and policy.needs_history(ctx.principal, ctx.tool):
            history = await self._history(policy.flow, ctx, time.time())
        decision = policy.decide(ctx.principal, ctx.tool, ctx.arguments, history)
        if decision.flow or (not decision.allowed and _has_when(policy, decision.rule_id)):
            record.extra["flow"] = flow_audit(decision.flow, history is not None)
        record.rule_id = decision.rule_id
        record.reason = decision.reason
        record.shadow = list(decision.shadow_denies)
        if not decision.allowed:
            if decision.reveal:
                raise PolicyDenied(ctx.tool.public_name, decision.rule_id, decision.description,
                                   log_detail=decision.reason,
                                   touched=tuple(dict.fromkeys(t.label for t in decision.flow)))
            raise UnknownTool(ctx.tool.public_name, log_detail=decision.reason)
        record.put(ALLOWANCE, Allowance(tuple(decision.limits), tuple(decision.concurrency), decision.cost))
        record.put(APPROVAL, decision.approval)


def _has_when(policy: PolicySet, rule_id: str | None) -> bool:
    return any(rule.id == rule_id and rule.when is not None for rule in policy.rules)
