"""Policy test cases: a YAML table of (principal, target, arguments) -> expected decision, for admins' CI."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import jsonschema

from bastion.catalogue import Naming
from bastion.errors import ConfigError
from bastion.policy.decide import PolicySet
from bastion.policy.flow import FlowHistory, Touch, touches_for
from bastion.policy.load import policy_schema, validate_document
from bastion.policy.model import Decision, Kind
from bastion.principal import Principal
from bastion.tool_entry import ToolEntry
from bastion.units import parse_duration
from bastion.uris import try_canonical
from bastion.yamlfile import load_yaml_text

_UNSET = "<unset>"
_KINDS: tuple[Kind, ...] = ("tool", "prompt", "resource")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    principal: Principal
    kind: Kind
    target: str
    upstream: str
    annotations: Mapping[str, Any]
    args: Mapping[str, Any] | None  # None: "may the principal see it in a listing?"
    expect: Literal["allow", "deny", "approve"]
    rule: str | None = _UNSET  # _UNSET: any rule; None: the default deny
    shadow: tuple[str, ...] | None = None
    history: tuple[PriorCall, ...] = ()


@dataclass(frozen=True, slots=True)
class PriorCall:
    """An earlier successful call of the case's context, ``ago_s`` seconds before it."""

    tool: ToolEntry
    ago_s: float
    injection: bool = False


@dataclass(frozen=True, slots=True)
class CaseFile:
    policies: tuple[Path, ...]
    cases: tuple[Case, ...]


# Case files carry no gateway config: the default naming (each upstream's prefix is its name) is assumed.
_DEFAULT_NAMING = Naming()


def upstream_of(public_name: str) -> str:
    """The upstream a public name belongs to by bastion's default naming ``<upstream>__<tool>``."""
    found = _DEFAULT_NAMING.upstreams_of_name(public_name)
    return found[0] if found else ""


def upstream_of_uri(uri: str) -> str:
    """The upstream a public resource URI belongs to by bastion's default naming ``<upstream>+<uri>``."""
    found = _DEFAULT_NAMING.upstreams_of_uri(try_canonical(uri) or uri)
    return found[0] if found else ""


def tool_entry(public_name: str, upstream: str | None = None,
               annotations: Mapping[str, Any] | None = None) -> ToolEntry:
    """A catalogue entry good enough for a policy decision when no live catalogue is at hand."""
    original = public_name.split("__", 1)[1] if "__" in public_name else public_name
    definition: dict[str, Any] = {"name": public_name, "inputSchema": {"type": "object"}}
    upstream_definition: dict[str, Any] = {"name": original, "inputSchema": {"type": "object"}}
    if annotations:
        upstream_definition["annotations"] = dict(annotations)
    return ToolEntry(public_name=public_name, upstream=upstream or upstream_of(public_name), original_name=original,
                     definition=definition, upstream_definition=upstream_definition)


def load_cases(path: Path) -> CaseFile:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read test file: {exc}", source=str(path)) from None
    doc = load_yaml_text(text, str(path))
    validate_document(doc, jsonschema.Draft202012Validator(policy_schema("cases.schema.json")),
                      "a mapping with 'policies:' and 'cases:'")
    raw_policies = doc.data["policies"]
    policies = tuple(path.parent / p for p in ([raw_policies] if isinstance(raw_policies, str) else raw_policies))
    cases = []
    for i, raw in enumerate(doc.data["cases"]):
        kinds: list[Kind] = [k for k in _KINDS if k in raw]
        if len(kinds) != 1:
            raise doc.error("each case names exactly one of 'tool', 'prompt' or 'resource'", f"cases[{i}]")
        kind = kinds[0]
        who = raw["principal"]
        principal = Principal(id=who["id"], groups=frozenset(who.get("groups", ())),
                              attributes=MappingProxyType(dict(who.get("claims", {}))))
        target = raw[kind]
        cases.append(Case(
            name=raw.get("name") or f"case {i + 1} (line {doc.line_of(f'cases[{i}]')})",
            principal=principal, kind=kind, target=target,
            upstream=raw.get("upstream") or (upstream_of(target) if kind != "resource" else upstream_of_uri(target)),
            annotations=raw.get("annotations", {}), args=raw.get("args", {}) if kind == "tool" else None,
            expect=raw["expect"], rule=raw.get("rule", _UNSET),
            shadow=tuple(raw["shadow"]) if "shadow" in raw else None,
            history=tuple(_prior(item, f"cases[{i}].history[{j}]", doc.error)
                          for j, item in enumerate(raw.get("history", [])))))
    return CaseFile(policies=policies, cases=tuple(cases))


def _prior(raw: Mapping[str, Any], path: str, error: Any) -> PriorCall:
    try:
        ago = parse_duration(raw["ago"], f"{path}.ago", allow_zero=True) if "ago" in raw else 0.0
    except ConfigError as exc:
        raise error(exc.message, exc.path) from None
    return PriorCall(tool_entry(raw["tool"], raw.get("upstream"), raw.get("annotations", {})), ago,
                     bool(raw.get("injection", False)))


# A fixed clock for test tables: decisions must not depend on when the table runs.
_NOW = 1_000_000_000.0


def case_history(policy: PolicySet, calls: tuple[PriorCall, ...]) -> FlowHistory:
    """The context history ``calls`` leave behind, as if each succeeded with a result that flowed back."""
    touches: list[Touch] = []
    for n, call in enumerate(calls):
        touches.extend(touches_for(policy.labels_of(call.tool), forwarded=True, succeeded=True, result_returned=True,
                                   injection=call.injection, settings=policy.flow, tool=call.tool.public_name,
                                   at=_NOW - call.ago_s, call_id=f"history[{n}]"))
    return FlowHistory(tuple(touches), _NOW)


def decide_case(policy: PolicySet, case: Case) -> Decision:
    if case.kind == "prompt":
        return policy.decide_prompt(case.principal, case.upstream, case.target)
    if case.kind == "resource":
        return policy.decide_resource(case.principal, case.upstream, case.target)
    return policy.decide(case.principal, tool_entry(case.target, case.upstream, case.annotations), case.args,
                         case_history(policy, case.history))


def check_case(policy: PolicySet, case: Case) -> list[str]:
    """What is wrong with ``case`` under ``policy``; empty if it passes."""
    decision = decide_case(policy, case)
    problems = []
    got = "deny" if not decision.allowed else "approve" if decision.approval is not None else "allow"
    if got != case.expect:
        problems.append(f"expected {case.expect}, got {got}: {decision.reason}")
    if case.rule != _UNSET and decision.rule_id != case.rule:
        problems.append(f"expected rule {case.rule!r}, got {decision.rule_id!r}")
    if case.shadow is not None and set(decision.shadow_denies) != set(case.shadow):
        problems.append(f"expected shadow denies {sorted(case.shadow)}, got {sorted(decision.shadow_denies)}")
    return problems
