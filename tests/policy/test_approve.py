"""``effect: approve``: loading, precedence against allow and deny, and what explain and test show."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.policy.cases import tool_entry
from bastion.policy.load import PolicyText, compile_policies
from bastion.principal import Principal

ALICE = Principal(id="alice", groups=frozenset({"eng"}))

BASE = """\
version: 1
rules:
  - id: eng-all
    effect: allow
    principals: {groups: [eng]}
    tools: ["fs__*"]
  - id: destructive
    effect: approve
    annotations: {destructiveHint: true}
    approval: {via: [admin], timeout: 2m, remember: session, message: "Destructive"}
  - id: deploy
    effect: approve
    tools: ["ci__deploy"]
    arguments:
      env: {enum: [prod]}
  - id: no-rm
    effect: deny
    tools: ["fs__rm"]
"""


def policy(text: str = BASE):  # type: ignore[no-untyped-def]
    return compile_policies([PolicyText("p.yaml", text)])


def test_an_approve_rule_on_annotations_adds_approval_to_what_another_rule_allows() -> None:
    decision = policy().decide(ALICE, tool_entry("fs__delete"), {})
    assert decision.allowed and decision.rule_id == "destructive"
    assert decision.approval is not None
    assert decision.approval.via == ("admin",) and decision.approval.timeout_s == 120
    assert decision.approval.remember == "session" and decision.approval.message == "Destructive"
    read = policy().decide(ALICE, tool_entry("fs__read", annotations={"readOnlyHint": True}), {})
    assert read.allowed and read.approval is None and read.rule_id == "eng-all"


def test_annotations_alone_never_let_a_tool_in() -> None:
    # An upstream claiming destructiveHint must not gain entry by it: no allow rule covers other__x.
    assert not policy().decide(ALICE, tool_entry("other__x"), {}).allowed


def test_an_approve_rule_without_annotations_permits_after_approval() -> None:
    held = policy().decide(Principal(id="bob"), tool_entry("ci__deploy", annotations={"destructiveHint": False}),
                           {"env": "prod"})
    assert held.allowed and held.rule_id == "deploy" and held.approval is not None
    assert held.approval.via == ("user", "admin") and held.approval.remember == "none"
    # Arguments outside the rule: not held, and nothing else allows it.
    assert not policy().decide(Principal(id="bob"), tool_entry("ci__deploy"), {"env": "dev"}).allowed
    # Listing: some call could be allowed after approval, so the tool is shown.
    assert policy().visible(Principal(id="bob"), tool_entry("ci__deploy"))


def test_deny_still_wins_over_approve() -> None:
    decision = policy().decide(ALICE, tool_entry("fs__rm"), {})
    assert not decision.allowed and decision.rule_id == "no-rm"


@pytest.mark.parametrize(("rule", "message"), [
    ("  - {id: x, effect: allow, approval: {via: [user]}}", "approval applies to 'effect: approve'"),
    ("  - {id: x, effect: approve, mode: shadow}", "shadow mode"),
    ("  - {id: x, effect: approve, approval: {timeout: 2h}}", "at most 3600"),
    ("  - {id: x, effect: approve, approval: {via: [robot]}}", "via"),
    ("  - {id: x, effect: approve, approval: {remember: forever}}", "remember"),
    ("  - {id: x, effect: approve, approval: {via: []}}", "via"),
])
def test_bad_approval_blocks_are_refused_with_their_path(rule: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        policy(f"version: 1\nrules:\n{rule}\n")
    assert message in str(info.value) or message in (info.value.path or "")


def test_explain_and_test_show_approval(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(BASE)
    out = subprocess.run([sys.executable, "-m", "bastion", "policy", "explain", "--policies", str(tmp_path),
                          "--principal", "alice", "--group", "eng", "--tool", "fs__delete"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0
    assert "decision:      approve" in out.stdout
    assert "approval:      by admin, waits 120 s, remember session" in out.stdout
    (tmp_path / "cases.yaml").write_text(
        "policies: p.yaml\ncases:\n"
        "  - {principal: {id: alice, groups: [eng]}, tool: fs__delete, expect: approve, rule: destructive}\n"
        "  - {principal: {id: alice, groups: [eng]}, tool: fs__read, annotations: {readOnlyHint: true},"
        " expect: allow}\n"
        "  - {principal: {id: alice, groups: [eng]}, tool: fs__delete, expect: allow}\n")
    tested = subprocess.run([sys.executable, "-m", "bastion", "policy", "test", str(tmp_path / "cases.yaml")],
                            capture_output=True, text=True, check=False)
    assert tested.returncode == 1
    assert "2 passed, 1 failed" in tested.stdout and "expected allow, got approve" in tested.stdout
