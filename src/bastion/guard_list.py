"""The tools/call guard list: which guards run around the forward, in which order, and why that order.

This is where a new guard goes. The pipeline (``bastion.pipeline``) runs the lists it is given and knows no
guard by name; the order below is the security decision, and each position carries its reason.
"""

from __future__ import annotations

from collections.abc import Callable

from bastion.call import RequestGuard, ResponseGuard
from bastion.flow import FlowStore, history_reader
from bastion.pinning import QuarantineGuard
from bastion.policy.guard import PolicyGuard, PolicyHolder
from bastion.ratelimit import Limiter, RateLimitConfig
from bastion.ratelimit.guard import RateLimitGuard
from bastion.refresh_gate import RefreshGate
from bastion.refresh_guard import RefreshGateGuard
from bastion.sanitize import ResultShapeGuard, SanitizeConfig, SanitizeGuard
from bastion.validation import InputSchemaGuard, OutputSchemaGuard, ValidationConfig, validators_for
from bastion.view import View


def guard_list(view: Callable[[], View], gate: RefreshGate, gate_timeout_s: float, holder: PolicyHolder | None,
               limiter: Limiter, limits_cfg: RateLimitConfig, validation_cfg: ValidationConfig,
               sanitize_cfg: SanitizeConfig, flow: FlowStore | None = None,
               approval: RequestGuard | None = None) -> tuple[list[RequestGuard], list[ResponseGuard]]:
    """The tools/call pipeline. Order matters, and each position has its reason:

    - quarantine first: a tool bastion refuses (hostile schema, unapproved definition change) is unknown to
      everyone, whatever the policy says; it costs a dict lookup.
    - policy next: unauthorised callers never touch Redis, the validators or the upstream.
    - approval right after policy, before the rate limit: a call an ``effect: approve`` rule holds waits for a
      person here, holding no concurrency slot and spending no rate budget. A person may take minutes; a slot
      held that long would starve the caller's other calls (and, for a per-tool limit, everyone's), and a call
      that is declined or times out did no work that should count. What bounds the waiting calls instead is the
      approvals caps (``approvals.max_pending``, ``max_pending_per_principal``). An approved call then passes
      the rate limit like any other, so approval never bypasses a limit.
    - rate limit after policy: only authorised attempts count, and it counts every one of them, so argument
      probing against the schema is limited too.
    - input schema after those: invalid arguments never reach the upstream.
    - refresh gate last, right before the forward: a call whose upstream's definitions are being re-checked
      waits for the check, and one whose definition changed after the guards judged it is refused, so nothing
      is forwarded on a definition that was not checked (its verdict is the last step before the transport).

    After the forward: result shape first (a result that is not a CallToolResult cannot be validated or
    sanitized, and capping its content blocks bounds every step after it), then output schema (nothing may trust
    output before it is validated), sanitize last (nothing after it can reintroduce what it removed).
    """
    lookup = validators_for(view)
    request_guards: list[RequestGuard] = [QuarantineGuard(lambda: view().quarantined)]
    if holder is not None:
        request_guards.append(PolicyGuard(holder, None if flow is None else history_reader(flow)))
        if approval is not None:
            request_guards.append(approval)
    request_guards += [RateLimitGuard(limiter, limits_cfg), InputSchemaGuard(lookup),
                       RefreshGateGuard(gate, view, gate_timeout_s)]
    response_guards: list[ResponseGuard] = [ResultShapeGuard(sanitize_cfg),
                                            OutputSchemaGuard(lookup, validation_cfg.mode_for_tool),
                                            SanitizeGuard(sanitize_cfg)]
    return request_guards, response_guards
