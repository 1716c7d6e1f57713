"""``reveal``: a denied call answers "unknown tool" unless the admin opted in, per rule or for the whole set."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from bastion.call import CallContext, CallRecord
from bastion.errors import INVALID_PARAMS, POLICY_DENIED, ConfigError, PolicyDenied, UnknownTool
from bastion.policy.guard import PolicyGuard, PolicyHolder
from bastion.policy.load import PolicyText, compile_policies
from tests.policy.support import policy, tool, who
from tests.policy.test_cli import cli

RULES = """
    version: 1
    {top}
    rules:
      - id: eng
        effect: allow
        principals: {{groups: [eng]}}
      - id: no-prod-writes
        effect: deny
        description: "Writes to production go through #prod-changes"
        tools: ["db__write_*"]
        {rule_reveal}
      - id: hide-vault
        effect: deny
        tools: [vault__read]
        {vault_reveal}
"""


def _set(top: str = "", rule_reveal: str = "", vault_reveal: str = "") -> object:
    return policy(RULES.format(top=top, rule_reveal=rule_reveal, vault_reveal=vault_reveal))


def test_denials_hide_by_default() -> None:
    decision = _set().decide(who("a", "eng"), tool("db__write_row"), {})
    assert (decision.allowed, decision.rule_id, decision.reveal) == (False, "no-prod-writes", False)
    assert decision.description == "Writes to production go through #prod-changes"


def test_a_rule_can_reveal_its_own_denials_only() -> None:
    ps = _set(rule_reveal="reveal: true")
    assert ps.decide(who("a", "eng"), tool("db__write_row"), {}).reveal is True
    assert ps.decide(who("a", "eng"), tool("vault__read"), {}).reveal is False
    assert ps.decide(who("nobody"), tool("files__read"), {}).reveal is False  # default deny follows the set


def test_the_set_wide_flag_covers_the_default_deny_and_rules_can_opt_out() -> None:
    ps = _set(top="reveal: true", vault_reveal="reveal: false")
    assert ps.decide(who("a", "eng"), tool("db__write_row"), {}).reveal is True
    assert ps.decide(who("a", "eng"), tool("vault__read"), {}).reveal is False
    default = ps.decide(who("nobody"), tool("files__read"), {})
    assert (default.allowed, default.rule_id, default.reveal) == (False, None, True)
    assert ps.decide(who("a", "eng"), tool("files__read"), {}).allowed


def test_reveal_on_an_allow_rule_and_disagreeing_files_are_load_errors() -> None:
    with pytest.raises(ConfigError, match="an allow rule denies nothing") as info:
        policy("""
            version: 1
            rules:
              - {id: a, effect: allow, reveal: true}
        """)
    assert info.value.path == "rules[0].reveal"
    with pytest.raises(ConfigError, match="set it in one file"):
        compile_policies([PolicyText("a.yaml", "version: 1\nreveal: true\n"),
                          PolicyText("b.yaml", "version: 1\nreveal: false\n")])
    agreeing = compile_policies([PolicyText("a.yaml", "version: 1\nreveal: true\n"),
                                 PolicyText("b.yaml", "version: 1\nreveal: true\nrules: []\n")])
    assert agreeing.reveal is True


async def _guard_error(ps: object, name: str) -> Exception:
    guard = PolicyGuard(PolicyHolder(ps))  # type: ignore[arg-type]
    ctx = CallContext(request_id="c", principal=who("a", "eng"), tool=tool(name), arguments={})
    record = CallRecord()
    with pytest.raises(Exception) as info:
        async with AsyncExitStack() as stack:
            await guard.check(ctx, record, stack)
    assert record.rule_id is not None
    return info.value


async def test_the_guard_answers_unknown_tool_or_the_rule_with_its_own_code() -> None:
    hidden = await _guard_error(_set(), "db__write_row")
    assert isinstance(hidden, UnknownTool)
    assert hidden.code == INVALID_PARAMS
    assert hidden.message == "Unknown tool: db__write_row"
    shown = await _guard_error(_set(rule_reveal="reveal: true"), "db__write_row")
    assert isinstance(shown, PolicyDenied)
    assert shown.code == POLICY_DENIED
    assert "no-prod-writes" in shown.message
    assert "Writes to production go through #prod-changes" in shown.message
    assert shown.data == {"tool": "db__write_row", "rule": "no-prod-writes",
                          "description": "Writes to production go through #prod-changes"}


def test_explain_shows_what_the_caller_is_told(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text(RULES.format(top="", rule_reveal="reveal: true", vault_reveal="").replace("\n    ", "\n"))
    shown = cli("explain", "--policies", str(file), "--principal", "a", "--group", "eng", "--tool", "db__write_row")
    assert shown.returncode == 1
    assert "caller sees:   rule and description (reveal: true)" in shown.stdout
    assert "description:   Writes to production go through #prod-changes" in shown.stdout
    hidden = cli("explain", "--policies", str(file), "--principal", "a", "--group", "eng", "--tool", "vault__read",
                 "--json")
    data = json.loads(hidden.stdout)
    assert (data["decision"], data["rule"], data["reveal"]) == ("deny", "hide-vault", False)
