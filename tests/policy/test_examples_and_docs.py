"""The shipped examples stay valid, and the reference documents every key of the schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.policy.cases import check_case, load_cases
from bastion.policy.load import load_policies, policy_schema

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted([*(REPO / "policies").glob("*.yaml"), *(REPO / "examples" / "demo" / "policies").glob("*.yaml")])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_example_policy_file_loads_on_its_own(path: Path) -> None:
    assert load_policies([path]).rules


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 4


def test_example_cases_pass() -> None:
    case_file = load_cases(REPO / "policies" / "tests" / "cases.yaml")
    policy = load_policies(case_file.policies)
    failures = {case.name: check_case(policy, case) for case in case_file.cases}
    assert {name: problems for name, problems in failures.items() if problems} == {}


def test_demo_policy_lets_anonymous_call_everything_and_shadows_destructive_tools() -> None:
    from bastion.policy.cases import tool_entry
    from bastion.principal import Principal

    demo = load_policies([REPO / "examples" / "demo" / "policies"])
    decision = demo.decide(Principal.anonymous(), tool_entry("files__delete", annotations={}), {})
    assert decision.allowed
    assert decision.shadow_denies == ("demo-shadow-destructive",)
    assert demo.decide_prompt(Principal.anonymous(), "x", "x__p").allowed


def _schema_keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                yield from value
            yield from _schema_keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from _schema_keys(item)


def _schema_enums(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "enum" and isinstance(value, list):
                yield from (v for v in value if isinstance(v, str))
            yield from _schema_enums(value)
    elif isinstance(node, list):
        for item in node:
            yield from _schema_enums(item)


def test_docs_mention_every_schema_key_and_enum_value() -> None:
    docs = (REPO / "docs" / "policy.md").read_text(encoding="utf-8")
    schema = policy_schema()
    keys = set(_schema_keys(schema))
    assert {"version", "rules", "path_prefix", "destructiveHint", "per"} <= keys
    assert sorted(k for k in keys if f"`{k}`" not in docs) == []
    assert sorted(v for v in set(_schema_enums(schema)) if f"`{v}`" not in docs) == []


def test_docs_mention_every_case_file_key() -> None:
    docs = (REPO / "docs" / "policy.md").read_text(encoding="utf-8")
    keys = set(_schema_keys(policy_schema("cases.schema.json")))
    assert sorted(k for k in keys if f"`{k}`" not in docs) == []
