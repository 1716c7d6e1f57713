"""The ``approval`` request guard: holds a call an ``effect: approve`` rule matched until a person says yes.

It runs right after the policy guard and before the rate limiter (see ``guard_list`` for why), asks the calling
user through the client when the client can be asked (``elicitation/create`` in the session-based era) and lets
admins decide at the same time; the first verdict wins. Approved: the call goes on. Declined, timed out, or
refused because too many calls wait: a tool error the model can read. Either way the call's one audit record
carries the ``approval`` facts; a client that cancels withdraws the approval.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, ClassVar

from redis.exceptions import RedisError

from bastion.approvals.model import PendingApproval, Verdict, new_approval_id, summarize
from bastion.approvals.service import ApprovalService, ApprovalsFull, UserAsk
from bastion.call import AskClient, CallContext, CallRecord
from bastion.errors import BastionError, ToolError
from bastion.outcome import Outcome
from bastion.policy.model import APPROVAL, ApprovalSpec

# What a session-remembered yes is worth at most: a session idles out long before in practice.
REMEMBER_TTL_S = 24 * 3600.0
# The schema of the question: one yes/no the user ticks; "decline" and "cancel" also mean no.
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approve": {"type": "boolean", "title": "Approve this call",
                               "description": "Run the tool call described above", "default": False}},
    "required": ["approve"],
}


class NotApproved(ToolError):
    """The call was not approved (declined, timed out, refused, or nobody could be asked): it was not run."""

    outcome: ClassVar[Outcome | None] = "denied"


def elicitation_params(pending: PendingApproval) -> dict[str, Any]:
    """The form the user sees: tool, upstream, argument summary and the rule's message."""
    lines = [pending.message or "A policy rule requires your approval for this tool call.", "",
             f"Tool: {pending.tool} (upstream {pending.upstream})", f"Rule: {pending.rule_id}"]
    if pending.arguments:
        lines.append("Arguments:")
        lines.extend(f"  {k}: {v}" for k, v in pending.arguments.items())
    # No "mode": form is the default when it is absent (2025-11-25), and older revisions do not know the field.
    return {"message": "\n".join(lines), "requestedSchema": APPROVAL_SCHEMA}


def verdict_of_elicitation(answer: Mapping[str, Any], by: str, at: float) -> Verdict:
    """accept with ``approve: true`` is a yes; every other answer (decline, cancel, approve: false) a no."""
    content = answer.get("content")
    yes = answer.get("action") == "accept" and isinstance(content, Mapping) and content.get("approve") is True
    return Verdict("approved" if yes else "declined", "elicitation", by=by, at=at)


class ApprovalGuard:
    name = "approval"

    def __init__(self, service: ApprovalService, *, clean: Callable[[str], str] | None = None,
                 on_outcome: Callable[[str, str], None] | None = None) -> None:
        self._service = service
        self._clean = clean
        self._on_outcome = on_outcome

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None:
        spec = record.get(APPROVAL)
        if spec is None:
            return
        rule_id = record.rule_id or ""
        facts: dict[str, Any] = {"id": None, "rule_id": rule_id, "via": list(spec.via), "outcome": None,
                                 "channel": None, "by": None, "waited_ms": 0.0}
        record.approval = facts
        key = _remember_key(spec, ctx, rule_id)
        if key is not None and await self._service.remembered(key):
            facts.update(outcome="approved", channel="remembered", by=ctx.principal.id)
            self._count("approved", "remembered")
            return
        rnd = ctx.approval_round
        if ctx.era == "modern" and rnd is not None:
            if rnd.approved_rule == rule_id:
                facts.update(outcome="approved", channel="elicitation", by=ctx.principal.id)
                return  # approved in an earlier round of this same request (already counted there)
            if rnd.asked_rule == rule_id and rnd.answer is not None:
                verdict = verdict_of_elicitation(rnd.answer, ctx.principal.id, time.time())
                facts.update(outcome=verdict.outcome, channel="elicitation", by=verdict.by)
                self._count(verdict.outcome, "elicitation")
                if verdict.approved:
                    if key is not None:
                        await self._service.remember(key, REMEMBER_TTL_S)
                    return
                raise NotApproved(f"This call to {ctx.tool.public_name} was declined by the user; it was not run")
            if "user" in spec.via and rnd.can_ask:
                # Stateless: the question goes back as an input_required result; the retry carries the answer.
                now = time.time()
                question = PendingApproval(
                    id=new_approval_id(), principal=ctx.principal.id, tool=ctx.tool.public_name,
                    upstream=ctx.tool.upstream, rule_id=rule_id, message=spec.message,
                    arguments=summarize(ctx.arguments, self._clean), via=spec.via, created_at=now,
                    expires_at=now + spec.timeout_s, session=None, replica="")
                record.approval_question = elicitation_params(question)
                facts.update(id=question.id, outcome="asked", channel="elicitation")
                return
        ask_user = self._user_ask(ctx, spec)
        if ask_user is None and "admin" not in spec.via:
            facts.update(outcome="unavailable", channel="gateway")
            self._count("unavailable", "gateway")
            raise NotApproved(f"This call to {ctx.tool.public_name} needs the calling user's approval, but this client "
                              "cannot be asked on this request (it did not declare elicitation support)")
        approval_id = new_approval_id()
        facts["id"] = approval_id
        # Until a verdict says otherwise, a call that ends here was withdrawn (the client cancelled it).
        facts.update(outcome="withdrawn", channel="gateway")
        started = time.monotonic()
        try:
            _, verdict = await self._service.request(
                approval_id=approval_id, principal=ctx.principal.id, tool=ctx.tool.public_name,
                upstream=ctx.tool.upstream, rule_id=rule_id, message=spec.message,
                arguments=summarize(ctx.arguments, self._clean), via=spec.via, timeout_s=spec.timeout_s,
                session=ctx.session_id, ask_user=ask_user)
        except ApprovalsFull as exc:
            facts.update(outcome="refused", channel="gateway")
            self._count("refused", "gateway")
            raise NotApproved(f"This call to {ctx.tool.public_name} needs approval, but {exc}; try again later") \
                from None
        except (RedisError, OSError) as exc:
            # The shared store is unreachable: nobody could see or decide the approval, so the call fails closed.
            facts.update(outcome="unavailable", channel="gateway")
            self._count("unavailable", "gateway")
            raise NotApproved(f"This call to {ctx.tool.public_name} needs approval, but approvals are unavailable "
                              "right now; it was not run", log_detail=f"approval store: {type(exc).__name__}") from None
        except asyncio.CancelledError:
            facts["waited_ms"] = round((time.monotonic() - started) * 1000, 3)
            self._count("withdrawn", "gateway")
            raise
        facts.update(outcome=verdict.outcome, channel=verdict.channel, by=verdict.by,
                     waited_ms=round((time.monotonic() - started) * 1000, 3))
        self._count(verdict.outcome, verdict.channel)
        if verdict.approved:
            if key is not None:
                await self._service.remember(key, REMEMBER_TTL_S)
            return
        if verdict.outcome == "timed_out":
            raise NotApproved(f"This call to {ctx.tool.public_name} needs approval and none came within "
                              f"{spec.timeout_s:g} s; it was not run")
        who = "the user" if verdict.channel == "elicitation" else "an administrator"
        raise NotApproved(f"This call to {ctx.tool.public_name} was declined by {who}; it was not run")

    def _user_ask(self, ctx: CallContext, spec: ApprovalSpec) -> UserAsk | None:
        ask = ctx.ask_client
        if ask is None or "user" not in spec.via:
            return None
        client: AskClient = ask
        principal = ctx.principal.id

        async def ask_user(pending: PendingApproval) -> Verdict | None:
            try:
                answer = await client("elicitation/create", elicitation_params(pending), spec.timeout_s)
            except BastionError:
                return None  # the client could not answer (error, timeout): an admin may still decide
            return verdict_of_elicitation(answer, principal, time.time())

        return ask_user

    def _count(self, outcome: str, channel: str) -> None:
        if self._on_outcome is not None:
            self._on_outcome(outcome, channel)


def _remember_key(spec: ApprovalSpec, ctx: CallContext, rule_id: str) -> str | None:
    """``session``: this tool and rule for the session; ``call``: the same arguments to this tool and rule
    in the session (or, without one, for this principal). ``none``: nothing is remembered."""
    if spec.remember == "none":
        return None
    scope = f"s:{ctx.session_id}" if ctx.session_id else f"p:{ctx.principal.id}"
    if spec.remember == "session":
        if ctx.session_id is None:
            return None  # no session to remember it for
        return f"{scope}:{rule_id}:{ctx.tool.public_name}"
    digest = hashlib.sha256(json.dumps(ctx.arguments, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return f"{scope}:{rule_id}:{ctx.tool.public_name}:{digest}"
