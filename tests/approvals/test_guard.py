"""The approval guard in process: what it records and answers when the store is down or the client cannot be asked."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from bastion.approvals import ApprovalsConfig, ApprovalService
from bastion.approvals.guard import ApprovalGuard, elicitation_params, verdict_of_elicitation
from bastion.approvals.model import PendingApproval, summarize
from bastion.approvals.store import RedisApprovalStore
from bastion.call import CallRecord
from bastion.errors import ToolError
from bastion.policy.model import APPROVAL, ApprovalSpec
from bastion.redisconn import SHARED, open_client
from tests.audit.helpers import context
from tests.support.net import free_port


def held(spec: ApprovalSpec) -> CallRecord:
    record = CallRecord(rule_id="r")
    record.put(APPROVAL, spec)
    return record


async def test_an_unreachable_store_fails_closed_with_a_tool_error() -> None:
    client = open_client(f"redis://127.0.0.1:{free_port()}/0", SHARED)
    outcomes: list[tuple[str, str]] = []
    guard = ApprovalGuard(ApprovalService(ApprovalsConfig(), RedisApprovalStore(client)),
                          on_outcome=lambda o, c: outcomes.append((o, c)))
    record = held(ApprovalSpec(via=("admin",), timeout_s=5))
    with pytest.raises(ToolError, match="approvals are unavailable"):
        await guard.check(context(), record, AsyncExitStack())
    assert record.approval is not None and record.approval["outcome"] == "unavailable"
    assert outcomes == [("unavailable", "gateway")]
    await client.aclose()


async def test_user_only_approval_without_a_way_to_ask_is_refused_at_once() -> None:
    guard = ApprovalGuard(ApprovalService(ApprovalsConfig()))
    record = held(ApprovalSpec(via=("user",)))
    with pytest.raises(ToolError, match="cannot be asked"):
        await guard.check(context(), record, AsyncExitStack())
    assert record.approval is not None and record.approval["outcome"] == "unavailable"


async def test_calls_no_rule_holds_pass_untouched() -> None:
    record = CallRecord()
    await ApprovalGuard(ApprovalService(ApprovalsConfig())).check(context(), record, AsyncExitStack())
    assert record.approval is None


def test_only_an_explicit_yes_approves() -> None:
    assert verdict_of_elicitation({"action": "accept", "content": {"approve": True}}, "a", 0).approved
    for answer in ({"action": "accept", "content": {"approve": False}}, {"action": "accept", "content": {}},
                   {"action": "accept", "content": {"approve": "true"}}, {"action": "decline"}, {"action": "cancel"},
                   {}):
        assert verdict_of_elicitation(answer, "a", 0).outcome == "declined"


def test_the_form_summarises_arguments_without_control_characters_or_bulk() -> None:
    args = {"path": "/a\x1b[31mred\u202e", "blob": "x" * 500, **{f"k{i}": i for i in range(30)}}
    summary = summarize(args)
    assert summary["path"] == "/a [31mred "
    assert len(summary["blob"]) == 120 and summary["blob"].endswith("…")
    assert len(summary) == 21 and summary["…"] == "12 more argument(s)"
    pending = PendingApproval(id="i", principal="alice", tool="fs__rm", upstream="fs", rule_id="r", message="Careful",
                              arguments=summary, via=("user",), created_at=0, expires_at=1, session=None, replica="x")
    params = elicitation_params(pending)
    assert params["message"].startswith("Careful\n") and "Tool: fs__rm (upstream fs)" in params["message"]
    assert params["requestedSchema"]["required"] == ["approve"]
