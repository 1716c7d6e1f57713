"""Schema-valid mappings to compiled rules, with the checks a JSON Schema cannot express.

Errors are ConfigErrors carrying only the key path; the loader adds file and line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bastion.errors import ConfigError
from bastion.policy.constraints import ArgConstraint
from bastion.policy.flow import FlowCondition, FlowSettings, LabelRule
from bastion.policy.model import ApprovalSpec, CostWeight, Kind, PrincipalMatch, Rule
from bastion.policy.names import (
    Glob,
    check_name_glob,
    check_uri_glob,
    compile_name_glob,
    compile_uri_glob,
    is_safe_name,
)
from bastion.protocol import methods as m
from bastion.ratelimit.model import ConcurrencySpec, RateLimitSpec, parse_methods, parse_rate
from bastion.units import parse_duration
from bastion.yamlfile import YamlDoc

# One hour: beyond it a held call outlives any client's patience and any proxy's idle timeout.
MAX_APPROVAL_TIMEOUT_S = 3600.0
DEFAULT_APPROVAL_TIMEOUT_S = 120.0
# The forwarded requests for each kind of thing a rule governs: a limit of the rule counts only these.
_METHODS_OF = {"tool": (m.TOOLS_CALL,), "prompt": (m.PROMPTS_GET, m.COMPLETE),
               "resource": (m.RESOURCES_READ, m.RESOURCES_SUBSCRIBE, m.RESOURCES_UNSUBSCRIBE, m.COMPLETE)}
_KIND_WORDS = {"tool": "tools", "prompt": "prompts", "resource": "resources"}

_KINDS: dict[str, Kind] = {"tools": "tool", "prompts": "prompt", "resources": "resource"}
_ALLOW_ON_ANNOTATIONS = (
    "an allow rule cannot match on annotations: annotations are hints an upstream writes about its own tools, "
    "so any tool could claim readOnlyHint: true to be let in. Use annotations only in deny rules (to tighten); "
    "allow by tool name or upstream")


def build_rule(raw: Mapping[str, Any], path: str, doc: YamlDoc) -> Rule:
    effect = raw["effect"]
    mode = raw.get("mode", "enforce")
    approval = _approval(raw, path)
    if effect == "allow" and "annotations" in raw:
        raise ConfigError(_ALLOW_ON_ANNOTATIONS, path=f"{path}.annotations")
    if effect == "allow" and mode == "shadow":
        raise ConfigError("shadow mode is for deny rules: it reports calls the rule would deny. To try out an "
                          "allow rule, test it with 'bastion policy test' instead", path=f"{path}.mode")
    if effect == "allow" and "reveal" in raw:
        raise ConfigError("reveal says how a denial is answered; an allow rule denies nothing (set it on the deny "
                          "rule, or at the top of the file for the default deny)", path=f"{path}.reveal")
    if effect == "deny":
        for key in ("limits", "concurrency"):
            if key in raw:
                raise ConfigError(f"{key} attach to allow rules (they limit what is allowed); a deny rule has "
                                  "nothing to limit", path=f"{path}.{key}")
    if "when" in raw and effect != "deny":
        raise ConfigError("when (a flow condition) is for deny rules: it refuses what an earlier call made unsafe. "
                          "An allow rule that depended on history would let a context unlock tools",
                          path=f"{path}.when")
    if effect == "allow" and "labels" in raw:
        raise ConfigError("an allow rule cannot match on labels: labels may come from annotations an upstream "
                          "writes about its own tools. Use labels in deny rules; allow by tool name or upstream",
                          path=f"{path}.labels")
    named = [k for k in ("tools", "prompts", "resources") if k in raw]
    tool_only = [k for k in ("arguments", "annotations", "labels", "when") if k in raw]
    if tool_only and set(named) - {"tools"}:
        raise ConfigError(f"{' and '.join(tool_only)} apply to tools only, but this rule also lists "
                          f"{' and '.join(sorted(set(named) - {'tools'}))}; split it into two rules", path=path)
    kinds: frozenset[Kind]
    if named:
        kinds = frozenset(_KINDS[k] for k in named)
    elif tool_only:
        kinds = frozenset({"tool"})
    else:
        kinds = frozenset({"tool", "prompt", "resource"})
    return Rule(
        id=raw["id"], effect=effect, mode=mode, origin=f"{doc.source}:{doc.line_of(path)}", kinds=kinds,
        description=raw.get("description"),
        principals=_principals(raw["principals"]) if "principals" in raw else None,
        tools=_name_globs(raw["tools"], f"{path}.tools") if "tools" in raw else None,
        upstreams=_upstreams(raw["upstreams"], f"{path}.upstreams") if "upstreams" in raw else None,
        annotations=tuple(sorted(raw.get("annotations", {}).items())),
        arguments=tuple(ArgConstraint.from_mapping(name, spec, f"{path}.arguments.{name}")
                        for name, spec in raw.get("arguments", {}).items()),
        prompts=_name_globs(raw["prompts"], f"{path}.prompts") if "prompts" in raw else None,
        resources=_uri_globs(raw["resources"], f"{path}.resources") if "resources" in raw else None,
        limits=tuple(_limit(spec, f"{path}.limits[{i}]", kinds) for i, spec in enumerate(raw.get("limits", []))),
        concurrency=tuple(ConcurrencySpec(name=spec["name"], scope=spec.get("per", "principal"), max=spec["max"],
                                          methods=_methods(spec, f"{path}.concurrency[{i}]", kinds))
                          for i, spec in enumerate(raw.get("concurrency", []))),
        reveal=raw.get("reveal"),
        labels=frozenset(raw["labels"]) if "labels" in raw else None,
        when=_when(raw["when"], f"{path}.when") if "when" in raw else None,
        approval=approval,
    )


def build_label_rule(raw: Mapping[str, Any], path: str, doc: YamlDoc) -> LabelRule:
    return LabelRule(
        labels=tuple(dict.fromkeys(raw["labels"])), origin=f"{doc.source}:{doc.line_of(path)}",
        tools=_name_globs(raw["tools"], f"{path}.tools") if "tools" in raw else None,
        upstreams=_upstreams(raw["upstreams"], f"{path}.upstreams") if "upstreams" in raw else None,
        annotations=tuple(sorted(raw.get("annotations", {}).items())),
        touched_on=raw.get("touched_on", "success"))


def build_flow_settings(raw: Mapping[str, Any], path: str) -> FlowSettings:
    default = FlowSettings()
    return FlowSettings(
        sanitize_label=raw.get("sanitize_label", default.sanitize_label),
        stateless_window_s=parse_duration(raw["stateless_window"], f"{path}.stateless_window")
        if "stateless_window" in raw else default.stateless_window_s,
        retention_s=parse_duration(raw["retention"], f"{path}.retention")
        if "retention" in raw else default.retention_s,
        max_touches=raw.get("max_touches", default.max_touches))


def _when(raw: Mapping[str, Any], path: str) -> FlowCondition:
    within = parse_duration(raw["within"], f"{path}.within") if "within" in raw else None
    return FlowCondition(touched=tuple(dict.fromkeys(raw["touched"])), within_s=within,
                         at_least=raw.get("at_least", 1))


def _approval(raw: Mapping[str, Any], path: str) -> ApprovalSpec | None:
    """The ``approval`` block of an ``effect: approve`` rule (defaults when absent); refused on other effects."""
    effect = raw["effect"]
    if effect != "approve":
        if "approval" in raw:
            raise ConfigError("approval applies to 'effect: approve' rules only", path=f"{path}.approval")
        return None
    if raw.get("mode", "enforce") == "shadow":
        raise ConfigError("shadow mode is for deny rules; an approve rule either holds calls or does not",
                          path=f"{path}.mode")
    if "reveal" in raw:
        raise ConfigError("reveal says how a denial is answered; set it on deny rules", path=f"{path}.reveal")
    block = raw.get("approval") or {}
    timeout = parse_duration(block["timeout"], f"{path}.approval.timeout") if "timeout" in block \
        else DEFAULT_APPROVAL_TIMEOUT_S
    if timeout > MAX_APPROVAL_TIMEOUT_S:
        raise ConfigError(f"an approval may wait at most {int(MAX_APPROVAL_TIMEOUT_S)} s: a call held longer "
                          "outlives every client's request timeout", path=f"{path}.approval.timeout")
    return ApprovalSpec(via=tuple(block.get("via", ("user", "admin"))), timeout_s=timeout,
                        remember=block.get("remember", "none"), message=block.get("message"))


def build_costs(raw: Sequence[Mapping[str, Any]], path: str) -> list[CostWeight]:
    return [CostWeight(_name_globs(item["tools"], f"{path}[{i}].tools"), item["weight"])
            for i, item in enumerate(raw)]


def _principals(raw: Mapping[str, Any]) -> PrincipalMatch:
    claims = tuple((name, tuple(value) if isinstance(value, list) else (value,))
                   for name, value in raw.get("claims", {}).items())
    return PrincipalMatch(ids=frozenset(raw.get("ids", ())), groups=frozenset(raw.get("groups", ())),
                          claims=claims)


def _name_globs(raw: Sequence[str], path: str) -> tuple[Glob, ...]:
    for i, text in enumerate(raw):
        problem = check_name_glob(text)
        if problem:
            raise ConfigError(problem, path=f"{path}[{i}]")
    return tuple(compile_name_glob(text) for text in raw)


def _uri_globs(raw: Sequence[str], path: str) -> tuple[Glob, ...]:
    for i, text in enumerate(raw):
        problem = check_uri_glob(text)
        if problem:
            raise ConfigError(problem, path=f"{path}[{i}]")
    return tuple(compile_uri_glob(text) for text in raw)


def _upstreams(raw: Sequence[str], path: str) -> frozenset[str]:
    for i, name in enumerate(raw):
        if not is_safe_name(name):
            raise ConfigError(f"invalid upstream name {name!r}: only ASCII letters, digits, '_', '.', '-'",
                              path=f"{path}[{i}]")
    return frozenset(raw)


def _limit(raw: Mapping[str, Any], path: str, kinds: frozenset[Kind]) -> RateLimitSpec:
    try:
        rate = parse_rate(raw["rate"])
    except ConfigError as exc:
        raise ConfigError(exc.message, path=f"{path}.rate") from None
    return RateLimitSpec(name=raw["name"], scope=raw.get("per", "principal"), rate=rate, burst=raw.get("burst"),
                         methods=_methods(raw, path, kinds))


def _methods(raw: Mapping[str, Any], path: str, kinds: frozenset[Kind]) -> frozenset[str] | None:
    """The schema checked the shape; the one list of methods a limit may name is ``protocol.methods.FORWARDED``.
    A limit that counts none of the requests for what its rule governs would never apply: refused, not ignored."""
    methods = parse_methods(raw.get("methods"), f"{path}.methods")
    governed = {method for kind in kinds for method in _METHODS_OF[kind]}
    if methods is not None and not methods & governed:
        what = " and ".join(_KIND_WORDS[k] for k in sorted(kinds))
        raise ConfigError(f"methods: this rule governs {what}, whose requests are "
                          f"{', '.join(sorted(governed))}; a limit counting only {', '.join(sorted(methods))} "
                          "would never apply", path=f"{path}.methods")
    return methods
