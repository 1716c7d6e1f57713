"""The decision function. Pure: a compiled policy set, a principal and a target in; a Decision out.

Precedence, the same for tools, prompts and resources:

1. A name outside the safe alphabet is refused outright (see ``names``): no rule can be about it.
2. Every enforced deny rule that matches refuses. Deny wins over allow, whatever the file or rule order.
3. Otherwise the first enforced allow or approve rule that matches permits; limits of all matching allow and
   approve rules apply. If any enforced approve rule matches, the call is permitted only once a person approves
   it (the first matching approve rule's ``approval`` applies). An approve rule that matches on annotations only
   adds approval to a call another rule permits: annotations are the upstream's own claims, so (as for allow)
   they can tighten but never let a tool in.
4. Otherwise the default: deny.

Shadow rules are evaluated alongside and reported in ``shadow_denies``; they never change the outcome.

Listing (``arguments=None``) asks "could any call to this tool be allowed?", so that ``tools/list`` shows exactly
the tools a call could reach: an allow rule with argument constraints counts (some arguments may satisfy it), a
deny rule with argument constraints does not hide the tool (some arguments may avoid it); a deny rule without them
does.

Flow (see ``flow``): a rule with ``labels`` matches tools carrying one of them; a rule with ``when`` matches only if
the context's history satisfies the condition. ``history=None`` on a call means the history could not be read:
every ``when`` then holds (fail closed; ``when`` is for deny rules only). Listing ignores ``when`` deny rules,
as it does deny rules with argument constraints: what a tool may do depends on the moment of the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bastion.policy.constraints import all3, json_equal
from bastion.policy.flow import FlowHistory, FlowSettings, LabelRule, Touch, TouchedOn, merge_labels
from bastion.policy.model import ANNOTATION_DEFAULTS, CostWeight, Decision, Kind, PrincipalMatch, Rule
from bastion.policy.names import Glob, is_safe_name, is_safe_uri
from bastion.principal import Principal
from bastion.protocol.methods import TOOLS_CALL
from bastion.ratelimit.model import ConcurrencySpec, RateLimitSpec, for_method
from bastion.tool_entry import ToolEntry
from bastion.uris import UriRefused, canonical_uri

_MISSING = object()


@dataclass(frozen=True, slots=True)
class _Target:
    kind: Kind
    name: str
    upstream: str
    annotations: Mapping[str, Any]
    labels: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PolicySet:
    """A validated, compiled set of rules from one or more files. Immutable; reloads build a new one."""

    rules: tuple[Rule, ...] = ()
    costs: tuple[CostWeight, ...] = ()
    version: str = "empty"
    files: tuple[str, ...] = ()
    # Explain denials by default (rules may still say ``reveal: false``); also covers the default deny.
    reveal: bool = False
    labels: tuple[LabelRule, ...] = ()
    flow: FlowSettings = field(default_factory=FlowSettings)
    # Labels per (tool, upstream, annotations): a call asks up to three times (guard, decision, recorder).
    _label_cache: dict[tuple[Any, ...], dict[str, TouchedOn]] = field(default_factory=dict, compare=False,
                                                                      repr=False)
    # Tool decisions that read neither arguments nor history, per (tool, principal): see ``decide``.
    # (init=False: ``dataclasses.replace`` makes a new set, which must not share the old set's decisions.)
    _decisions: dict[tuple[Any, ...], tuple[ToolEntry, Principal, Decision]] = field(
        default_factory=dict, init=False, compare=False, repr=False)
    # Whether some rule matches principals by claims: then a decision depends on more than id and groups.
    _claims: bool = field(default=False, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_claims", any(rule.principals is not None and rule.principals.claims
                                                for rule in self.rules))

    @property
    def has_flow(self) -> bool:
        """True iff some rule has a ``when`` condition: only then does any call need a context's history."""
        return any(rule.when is not None for rule in self.rules)

    @property
    def watched_labels(self) -> frozenset[str]:
        """The labels some ``when`` reads: only touches of these are worth recording."""
        return frozenset(label for rule in self.rules if rule.when is not None for label in rule.when.touched)

    def labels_of(self, tool: ToolEntry) -> dict[str, TouchedOn]:
        """The labels ``tool`` carries, each with what counts as touching it."""
        if not self.labels:
            return {}
        try:
            key: tuple[Any, ...] | None = (tool.public_name, tool.upstream, tuple(sorted(tool.annotations.items())))
            hash(key)
        except TypeError:  # an annotation value that is not hashable (a list): decide without the cache
            key = None
        if key is not None and (hit := self._label_cache.get(key)) is not None:
            return hit
        found: dict[str, TouchedOn] = {}
        for rule in self.labels:
            if _label_rule_matches(rule, tool):
                merge_labels(found, rule)
        if key is not None:
            if len(self._label_cache) >= _LABEL_CACHE_MAX:
                self._label_cache.clear()
            self._label_cache[key] = found
        return found

    def needs_history(self, principal: Principal, tool: ToolEntry) -> bool:
        """True iff deciding a call of ``tool`` by ``principal`` reads the context's history: some rule with
        ``when`` is about them. False for every call when no rule has ``when``, so those cost no store read."""
        if not self.has_flow:
            return False
        target = self._tool_target(tool)
        return any(rule.when is not None and "tool" in rule.kinds and principal_matches(rule.principals, principal)
                   and _target_matches(rule, target) for rule in self.rules)

    def decide(self, principal: Principal, tool: ToolEntry, arguments: Mapping[str, Any] | None,
               history: FlowHistory | None = None) -> Decision:
        """Decide a ``tools/call`` (``arguments`` given) or whether ``tools/list`` shows the tool (``None``).
        ``history``: the caller's context, when ``needs_history`` said it is needed."""
        # Most decisions depend on who calls which tool only. Those are kept, per tool entry (a catalogue
        # version's own object) and per principal (id and groups; the object itself when some rule reads claims),
        # for as long as this policy set is in force: a reload builds a new set with an empty cache. A decision
        # that read the arguments or the history (a matching rule with ``arguments`` or ``when``) is never kept.
        key: tuple[Any, ...] = (id(tool), arguments is None,
                                *((id(principal),) if self._claims else (principal.id, principal.groups)))
        hit = self._decisions.get(key)
        if hit is not None and hit[0] is tool and (hit[1] is principal or not self._claims):
            return hit[2]
        decision, consulted = self._decide(principal, tool, arguments, history)
        if not consulted:
            if len(self._decisions) >= _DECISION_CACHE_MAX:
                self._decisions.clear()
            self._decisions[key] = (tool, principal, decision)
        return decision

    def _decide(self, principal: Principal, tool: ToolEntry, arguments: Mapping[str, Any] | None,
                history: FlowHistory | None) -> tuple[Decision, bool]:
        """The decision, and whether it read the arguments or the history."""
        if not is_safe_name(tool.public_name):
            return replace(_unsafe("tool name", tool.public_name), reveal=self.reveal), False
        target = self._tool_target(tool)
        decision, consulted = self._run(principal, target, arguments, history)
        if not decision.allowed:
            return decision, consulted
        cost = max((c.weight for c in self.costs if _any_glob(c.tools, tool.public_name)), default=1)
        # Only the limits that count tools/call (``methods``): chosen here, once per kept decision, not per call.
        return Decision(decision.allowed, decision.rule_id, decision.reason, decision.shadow_denies,
                        for_method(decision.limits, TOOLS_CALL), for_method(decision.concurrency, TOOLS_CALL),
                        cost, approval=decision.approval), consulted

    def visible(self, principal: Principal, tool: ToolEntry) -> bool:
        """True iff some call to ``tool`` by ``principal`` could be allowed."""
        return self.decide(principal, tool, None).allowed

    def decide_prompt(self, principal: Principal, upstream: str, public_name: str) -> Decision:
        if not is_safe_name(public_name):
            return _unsafe("prompt name", public_name)
        return self._evaluate(principal, _Target("prompt", public_name, upstream, {}), None)

    def decide_resource(self, principal: Principal, upstream: str, uri: str) -> Decision:
        """Decide a resource URI in its canonical form (``bastion.uris``): every spelling of one resource meets the
        same rules. The caller forwards that same form upstream, so the upstream acts on exactly what was judged."""
        try:
            canonical = canonical_uri(uri)
        except UriRefused as exc:
            # Deny rules still report (on the URI as sent), but nothing may allow a URI without a canonical form.
            found = self._evaluate(principal, _Target("resource", uri, upstream, {}), None)
            if not found.allowed and found.rule_id is not None:
                return found
            return Decision(False, None, f"resource URI has {exc.reason}; no rule can allow it", found.shadow_denies)
        target = _Target("resource", canonical, upstream, {})
        if not is_safe_uri(canonical):
            # Deny rules still report, but nothing may allow a URI whose path could climb.
            found = self._evaluate(principal, target, None)
            if not found.allowed and found.rule_id is not None:
                return found
            return Decision(False, None, "resource URI is not plain ASCII or contains '.', '..', encoded separators "
                            "or backslashes; no rule can allow it", found.shadow_denies)
        return self._evaluate(principal, target, None)

    def _tool_target(self, tool: ToolEntry) -> _Target:
        labels = frozenset(self.labels_of(tool)) if self.labels else frozenset()
        return _Target("tool", tool.public_name, tool.upstream, tool.annotations, labels)

    def _evaluate(self, principal: Principal, target: _Target, arguments: Mapping[str, Any] | None,
                  history: FlowHistory | None = None) -> Decision:
        return self._run(principal, target, arguments, history)[0]

    def _run(self, principal: Principal, target: _Target, arguments: Mapping[str, Any] | None,
             history: FlowHistory | None = None) -> tuple[Decision, bool]:
        """The decision, and whether it read the arguments or the history (then it holds for this call only)."""
        consulted = False
        denies: list[Rule] = []
        evidence: dict[str, tuple[Touch, ...]] = {}
        allows: list[Rule] = []
        approves: list[Rule] = []
        shadow: list[str] = []
        for rule in self.rules:
            if target.kind not in rule.kinds or not principal_matches(rule.principals, principal):
                continue
            if not _target_matches(rule, target):
                continue
            if arguments is not None and (rule.arguments or rule.when is not None):
                consulted = True
            args = _arguments_match(rule, arguments)
            if rule.when is not None:
                if arguments is None:
                    continue
                chain = rule.when.evidence(history) if history is not None else ()
                if chain is None:
                    continue
                evidence[rule.id] = chain
            if rule.effect == "deny" and args is not False:
                if rule.enforced:
                    denies.append(rule)
                else:
                    shadow.append(rule.id)
            elif rule.effect == "allow" and args is True and rule.enforced:
                allows.append(rule)
            elif rule.effect == "approve" and args is True:
                approves.append(rule)
        if denies:
            first = denies[0]
            return Decision(False, first.id, f"denied by rule '{first.id}' ({first.origin})", tuple(shadow),
                            reveal=self.reveal if first.reveal is None else first.reveal,
                            description=first.description, flow=evidence.get(first.id, ())), consulted
        permits = [r for r in self.rules if r in allows or (r in approves and not r.annotations)]
        if permits:
            limits: dict[str, RateLimitSpec] = {}
            concurrency: dict[str, ConcurrencySpec] = {}
            for rule in permits + [r for r in approves if r not in permits]:
                limits.update((spec.name, spec) for spec in rule.limits if spec.name not in limits)
                concurrency.update((spec.name, spec) for spec in rule.concurrency if spec.name not in concurrency)
            if approves:
                gate = approves[0]
                return Decision(True, gate.id, f"allowed after approval, by rule '{gate.id}' ({gate.origin})",
                                tuple(shadow), tuple(limits.values()), tuple(concurrency.values()),
                                approval=gate.approval, description=gate.description), consulted
            first = permits[0]
            return Decision(True, first.id, f"allowed by rule '{first.id}' ({first.origin})", tuple(shadow),
                            tuple(limits.values()), tuple(concurrency.values())), consulted
        return Decision(False, None, f"no rule allows this {target.kind} (default deny)", tuple(shadow),
                        reveal=self.reveal), consulted


def principal_matches(match: PrincipalMatch | None, principal: Principal) -> bool:
    if match is None:
        return True
    if principal.id in match.ids or match.groups & principal.groups:
        return True
    return bool(match.claims) and all(
        _claim_matches(principal.attributes.get(name, _MISSING), wanted) for name, wanted in match.claims)


def effective_annotation(annotations: Mapping[str, Any], key: str) -> Any:
    """The value a policy sees: the tool's own hint if well-formed, else the MCP default. A destructiveHint
    only means something for tools that are not read-only, so a read-only tool that says nothing is not
    destructive."""
    default = ANNOTATION_DEFAULTS.get(key)
    value = annotations.get(key, _MISSING)
    if key == "destructiveHint" and value is _MISSING and annotations.get("readOnlyHint") is True:
        return False
    if value is _MISSING or (isinstance(default, bool) and not isinstance(value, bool)):
        return default
    return value


def _claim_matches(actual: Any, wanted: tuple[Any, ...]) -> bool:
    if actual is _MISSING:
        return False
    values = actual if isinstance(actual, list | tuple) else (actual,)
    return any(json_equal(v, w) for v in values for w in wanted)


def _target_matches(rule: Rule, target: _Target) -> bool:
    if rule.upstreams is not None and target.upstream not in rule.upstreams:
        return False
    if rule.labels is not None and not rule.labels & target.labels:
        return False
    globs = {"tool": rule.tools, "prompt": rule.prompts, "resource": rule.resources}[target.kind]
    if globs is not None and not _any_glob(globs, target.name):
        return False
    return all(json_equal(effective_annotation(target.annotations, key), value) for key, value in rule.annotations)


def _arguments_match(rule: Rule, arguments: Mapping[str, Any] | None) -> bool | None:
    if not rule.arguments:
        return True
    if arguments is None:
        # Listing: an allow (or approve) rule could be satisfied by some call; a deny rule avoided by some call.
        return rule.effect != "deny"
    return all3(c.evaluate(arguments) for c in rule.arguments)


_LABEL_CACHE_MAX = 10_000
_DECISION_CACHE_MAX = 10_000


def _label_rule_matches(rule: LabelRule, tool: ToolEntry) -> bool:
    if rule.upstreams is not None and tool.upstream not in rule.upstreams:
        return False
    if rule.tools is not None and not _any_glob(rule.tools, tool.public_name):
        return False
    return all(json_equal(effective_annotation(tool.annotations, k), v) for k, v in rule.annotations)


def _any_glob(globs: tuple[Glob, ...], name: str) -> bool:
    return any(g.matches(name) for g in globs)


def _unsafe(what: str, name: str) -> Decision:
    return Decision(False, None, f"{what} {name!r} has characters outside [A-Za-z0-9_.-]; no rule can match it")
