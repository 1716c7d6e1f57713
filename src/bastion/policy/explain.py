"""A policy decision as the tools that explain it show it: ``bastion policy explain`` and the admin console."""

from __future__ import annotations

from typing import Any

from bastion.policy.decide import PolicySet
from bastion.policy.model import Decision

__all__ = ["decision_json"]


def decision_json(decision: Decision, policy: PolicySet, labels: list[str] | None = None) -> dict[str, Any]:
    """A policy decision as ``bastion policy explain --json`` prints it and the console shows it."""
    labels = labels or []
    return {
        "decision": "deny" if not decision.allowed else "approve" if decision.approval is not None else "allow",
        # Set when the call waits for a person's yes (an effect: approve rule matched).
        "approval": None if decision.approval is None else {
            "via": list(decision.approval.via), "timeout_s": decision.approval.timeout_s,
            "remember": decision.approval.remember, "message": decision.approval.message},
        "rule": decision.rule_id,
        "reason": decision.reason,
        "shadow_denies": list(decision.shadow_denies),
        "limits": [{"name": s.name, "rate": str(s.rate), "burst": s.effective_burst, "per": s.scope}
                   for s in decision.limits],
        "concurrency": [{"name": s.name, "max": s.max, "per": s.scope} for s in decision.concurrency],
        "cost": decision.cost,
        # How a denied call is answered: the rule and description (true), or "Unknown tool" (false).
        "reveal": decision.reveal if not decision.allowed else None,
        "description": decision.description,
        "policy_version": policy.version,
        "labels": labels,
        # A flow denial: the earlier calls that made the rule's condition hold.
        "flow": [t.as_json() for t in decision.flow],
    }
