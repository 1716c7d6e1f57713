"""Flow-aware rules, the pure part: labels, when-conditions and the decision on a given history."""

from __future__ import annotations

import pytest

from bastion.errors import ConfigError
from bastion.policy.flow import FlowHistory, Touch, touches_for
from tests.policy.support import policy, tool, who

TRIFECTA = """
version: 1
labels:
  - labels: [private_data]
    tools: [files__read_file]
  - labels: [untrusted_content]
    tools: ["web__*"]
    touched_on: result
  - labels: [external_communication]
    tools: [mail__send]
  - labels: [external_communication]
    upstreams: [web]
    annotations: {openWorldHint: true}
rules:
  - id: everyone
    effect: allow
  - id: trifecta
    effect: deny
    reveal: true
    description: no sending after reading private and untrusted data
    labels: [external_communication]
    when: {touched: [private_data, untrusted_content]}
  - id: bulk
    effect: deny
    labels: [external_communication]
    when: {touched: [private_data], at_least: 3, within: 10m}
"""

NOW = 10_000.0


def hist(*touches: tuple[str, str, float]) -> FlowHistory:
    return FlowHistory(tuple(Touch(label, name, at, f"c{i}") for i, (label, name, at) in enumerate(touches)), NOW)


def test_labels_come_from_globs_upstreams_and_annotations_with_mcp_defaults() -> None:
    p = policy(TRIFECTA)
    assert set(p.labels_of(tool("files__read_file"))) == {"private_data"}
    assert p.labels_of(tool("web__fetch", annotations={"openWorldHint": False})) == {"untrusted_content": "result"}
    # No openWorldHint: the MCP default (true) applies, so the tool is external too.
    assert set(p.labels_of(tool("web__fetch"))) == {"untrusted_content", "external_communication"}
    assert p.labels_of(tool("other__x")) == {}


def test_the_third_call_of_the_trifecta_is_denied_with_its_evidence() -> None:
    p = policy(TRIFECTA)
    history = hist(("private_data", "files__read_file", NOW - 60), ("untrusted_content", "web__fetch", NOW - 30))
    decision = p.decide(who(), tool("mail__send"), {}, history)
    assert not decision.allowed
    assert decision.rule_id == "trifecta" and decision.reveal
    assert [(t.label, t.tool, t.call_id) for t in decision.flow] == [
        ("private_data", "files__read_file", "c0"), ("untrusted_content", "web__fetch", "c1")]


@pytest.mark.parametrize("touched", [(), ("private_data",), ("untrusted_content",)])
def test_part_of_the_trifecta_allows(touched: tuple[str, ...]) -> None:
    p = policy(TRIFECTA)
    history = hist(*((label, "x__y", NOW - 1) for label in touched))
    decision = p.decide(who(), tool("mail__send"), {}, history)
    assert decision.allowed and decision.rule_id == "everyone" and decision.flow == ()


def test_tools_without_the_rules_label_are_not_affected() -> None:
    p = policy(TRIFECTA)
    history = hist(("private_data", "a", NOW), ("untrusted_content", "b", NOW))
    assert p.decide(who(), tool("files__read_file"), {}, history).allowed


def test_at_least_and_within_count_only_recent_touches() -> None:
    p = policy(TRIFECTA)
    old = [("private_data", "files__read_file", NOW - 700.0)] * 3
    assert p.decide(who(), tool("mail__send"), {}, hist(*old)).allowed
    recent = [("private_data", "files__read_file", NOW - 60.0 * k) for k in (1, 2, 3)]
    decision = p.decide(who(), tool("mail__send"), {}, hist(*recent))
    assert decision.rule_id == "bulk" and len(decision.flow) == 3
    assert p.decide(who(), tool("mail__send"), {}, hist(*recent[:2])).allowed


def test_unknown_history_fails_closed_but_listing_ignores_when_rules() -> None:
    p = policy(TRIFECTA)
    denied = p.decide(who(), tool("mail__send"), {}, None)
    assert not denied.allowed and denied.rule_id == "trifecta" and denied.flow == ()
    assert p.visible(who(), tool("mail__send"))


def test_needs_history_only_for_calls_a_when_rule_is_about() -> None:
    p = policy(TRIFECTA)
    assert p.needs_history(who(), tool("mail__send"))
    assert not p.needs_history(who(), tool("files__read_file"))
    plain = policy("version: 1\nrules:\n  - {id: a, effect: allow}\n")
    assert not plain.has_flow and not plain.needs_history(who(), tool("mail__send"))


def test_touched_on_decides_which_endings_count_and_injection_adds_untrusted() -> None:
    p = policy(TRIFECTA)
    labels = p.labels_of(tool("web__fetch", annotations={"openWorldHint": False}))
    common = {"settings": p.flow, "tool": "web__fetch", "at": NOW, "call_id": "c"}
    assert touches_for(labels, forwarded=True, succeeded=True, result_returned=False, injection=False,
                       **common) == ()
    assert [t.label for t in touches_for(labels, forwarded=True, succeeded=True, result_returned=True,
                                         injection=False, **common)] == ["untrusted_content"]
    read = p.labels_of(tool("files__read_file"))
    hit = touches_for(read, forwarded=True, succeeded=True, result_returned=True, injection=True, **common)
    assert [t.label for t in hit] == ["private_data", "untrusted_content"]
    # A timeout: forwarded, no result. Only touched_on: any counts it.
    assert touches_for(read, forwarded=True, succeeded=False, result_returned=False, injection=False,
                       **common) == ()
    anyp = policy("version: 1\nlabels:\n  - {labels: [x], touched_on: any}\n")
    assert [t.label for t in touches_for(anyp.labels_of(tool("a__b")), forwarded=True, succeeded=False,
                                         result_returned=False, injection=False, **common)] == ["x"]


def test_sanitize_label_can_be_renamed_or_turned_off() -> None:
    off = policy("version: 1\nflow: {sanitize_label: null, stateless_window: 5m}\n")
    assert off.flow.sanitize_label is None and off.flow.stateless_window_s == 300
    assert touches_for({}, forwarded=True, succeeded=True, result_returned=True, injection=True,
                       settings=off.flow, tool="t", at=0, call_id="c") == ()


@pytest.mark.parametrize(("text", "message"), [
    ("rules:\n  - {id: a, effect: allow, when: {touched: [x]}}\n", "when (a flow condition) is for deny rules"),
    ("rules:\n  - {id: a, effect: allow, labels: [x]}\n", "an allow rule cannot match on labels"),
    ("rules:\n  - {id: a, effect: deny, when: {touched: []}}\n", "should be non-empty"),
    ("rules:\n  - {id: a, effect: deny, when: {touched: [x], within: soon}}\n", "expected a duration"),
    ("rules:\n  - {id: a, effect: deny, prompts: [p], when: {touched: [x]}}\n", "apply to tools only"),
    ("labels:\n  - {labels: [bad label]}\n", "does not match"),
    ("labels:\n  - {labels: [x], touched_on: sometimes}\n", "is not one of"),
])
def test_bad_flow_config_is_a_located_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        policy("version: 1\n" + text)
    assert message in str(err.value)
    assert err.value.line is not None


def test_flow_block_in_two_files_is_an_error() -> None:
    from bastion.policy.load import PolicyText, compile_policies
    with pytest.raises(ConfigError, match=r"flow block is already set in a\.yaml"):
        compile_policies([PolicyText("a.yaml", "version: 1\nflow: {}\n"),
                          PolicyText("b.yaml", "version: 1\nflow: {}\n")])
