"""Decisions kept per (tool, principal): only those that depend on nothing else, and never across policy sets."""

from __future__ import annotations

from dataclasses import replace

from bastion.policy.flow import FlowHistory, Touch
from tests.policy.support import policy, tool, who

POLICY = policy("""
    version: 1
    rules:
      - id: eng
        effect: allow
        principals: {groups: [engineering]}
        tools: ["files__*"]
      - id: no-secrets
        effect: deny
        tools: [files__read_file]
        arguments: {path: {path_prefix: /srv/secrets}}
""")
CLAIMS = policy("""
    version: 1
    rules:
      - id: readers
        effect: allow
        principals: {claims: {role: [reader]}}
        tools: ["gh__*"]
""")


def test_a_decision_that_reads_only_principal_and_tool_is_kept() -> None:
    entry, erin = tool("files__list"), who("erin", "engineering")
    first = POLICY.decide(erin, entry, {"a": 1})
    assert first.allowed and first.rule_id == "eng"
    assert POLICY.decide(erin, entry, {"b": 2}) is first
    # Another principal object with the same id and groups gets the same decision.
    assert POLICY.decide(who("erin", "engineering"), entry, {}) is first


def test_a_decision_that_read_the_arguments_is_made_again_for_every_call() -> None:
    entry, erin = tool("files__read_file"), who("erin", "engineering")
    assert POLICY.decide(erin, entry, {"path": "/srv/docs/a"}).rule_id == "eng"
    assert POLICY.decide(erin, entry, {"path": "/srv/secrets/key"}).rule_id == "no-secrets"
    assert POLICY.decide(erin, entry, {"path": "/srv/docs/b"}).allowed
    # Listing never reads arguments: kept, and still "visible" (some call may be allowed).
    assert POLICY.visible(erin, entry)
    assert POLICY.visible(erin, entry)


def test_groups_and_claims_are_part_of_the_principal() -> None:
    files, gh = tool("files__list"), tool("gh__get")
    assert POLICY.decide(who("erin", "engineering"), files, {}).allowed
    assert not POLICY.decide(who("erin", "sales"), files, {}).allowed
    # A policy that reads claims: principals with the same id and groups differ by their attributes.
    reader = who("carol", role="reader")
    assert CLAIMS.decide(reader, gh, {}).allowed
    assert not CLAIMS.decide(who("carol", role="writer"), gh, {}).allowed
    assert CLAIMS.decide(who("carol", role="reader"), gh, {}).allowed
    assert CLAIMS.decide(reader, gh, {}) is CLAIMS.decide(reader, gh, {})


def test_a_new_catalogue_entry_is_decided_afresh() -> None:
    erin = who("erin", "engineering")
    assert POLICY.decide(erin, tool("files__list"), {}).allowed
    assert not POLICY.decide(erin, tool("other__list"), {}).allowed


FLOW = policy("""
    version: 1
    labels:
      - {labels: [private_data], tools: [files__read_file]}
      - {labels: [external], tools: [mail__send]}
    rules:
      - {id: everyone, effect: allow}
      - {id: exfil, effect: deny, labels: [external], when: {touched: [private_data]}}
""")


def test_flow_decisions_are_never_kept() -> None:
    mail, alice, now = tool("mail__send"), who(), 1000.0
    read = FlowHistory((Touch("private_data", "files__read_file", now - 1, "c0"),), now)
    assert FLOW.decide(alice, mail, {}, read).rule_id == "exfil"
    assert FLOW.decide(alice, mail, {}, FlowHistory((), now)).allowed
    assert FLOW.decide(alice, mail, {}, None).rule_id == "exfil"  # unknown history: fails closed
    assert FLOW.decide(alice, mail, {}, FlowHistory((), now)).allowed


def test_a_reloaded_or_replaced_policy_set_starts_empty() -> None:
    entry, erin = tool("files__list"), who("erin", "engineering")
    assert POLICY.decide(erin, entry, {}).allowed
    stricter = replace(POLICY, rules=tuple(r for r in POLICY.rules if r.id != "eng"))
    assert not stricter.decide(erin, entry, {}).allowed
    assert POLICY.decide(erin, entry, {}).allowed
