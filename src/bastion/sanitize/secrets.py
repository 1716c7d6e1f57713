"""Secret redaction: a maintained rule pack plus admin rules and exceptions, matched in one RE2 pass.

Matches become ``[REDACTED:<rule-id>]``. Only rule ids and counts leave this module; the secret itself is never
logged or returned.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from bastion.errors import ConfigError
from bastion.sanitize.patterns import Hit, PatternSet, compile_any, non_overlapping
from bastion.sanitize.text import NO_COUNTS

_RULE_KEYS = frozenset({"id", "pattern", "description", "min_entropy"})
_POLICY_KEYS = frozenset({"enabled", "extra_rules", "allow", "allow_values", "disable"})
_RULE_PACK = "secrets.yaml"


@dataclass(frozen=True, slots=True)
class SecretRule:
    id: str
    pattern: str
    description: str = ""
    min_entropy: float | None = None

    @classmethod
    def from_mapping(cls, data: Any, path: str) -> SecretRule:
        if not isinstance(data, Mapping):
            raise ConfigError("a rule must be a mapping with id, pattern and description", path=path)
        unknown = set(data) - _RULE_KEYS
        if unknown:
            raise ConfigError(f"unknown key(s): {', '.join(sorted(map(str, unknown)))}", path=path)
        rule_id, pattern = data.get("id"), data.get("pattern")
        if not isinstance(rule_id, str) or not rule_id.replace("-", "").replace("_", "").isalnum():
            raise ConfigError("id must be a non-empty string of letters, digits, '-' and '_'", path=f"{path}.id")
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError("pattern must be a non-empty string", path=f"{path}.pattern")
        description = data.get("description", "")
        if not isinstance(description, str):
            raise ConfigError("description must be a string", path=f"{path}.description")
        entropy = data.get("min_entropy")
        if entropy is not None and (isinstance(entropy, bool) or not isinstance(entropy, int | float)
                                    or not 0 <= entropy <= 8):
            raise ConfigError("min_entropy must be a number of bits per character between 0 and 8",
                              path=f"{path}.min_entropy")
        compile_any(pattern, f"{path}.pattern")
        return cls(rule_id, pattern, description, float(entropy) if entropy is not None else None)


@cache
def rule_pack() -> tuple[SecretRule, ...]:
    """The rule pack shipped in ``bastion/sanitize/rules/secrets.yaml`` (read once; it is immutable)."""
    source = f"bastion/sanitize/rules/{_RULE_PACK}"
    try:
        raw = resources.files("bastion.sanitize").joinpath("rules").joinpath(_RULE_PACK).read_text(encoding="utf-8")
        data = yaml.safe_load(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the secret rule pack: {exc}", source=source) from None
    rules = data.get("rules") if isinstance(data, Mapping) else None
    if not isinstance(rules, list):
        raise ConfigError("expected a top-level 'rules' list", source=source)
    parsed = tuple(SecretRule.from_mapping(r, f"rules[{i}]") for i, r in enumerate(rules))
    _check_unique(parsed, "rules")
    return parsed


def _check_unique(rules: Iterable[SecretRule], path: str) -> None:
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise ConfigError(f"duplicate rule id '{rule.id}'", path=path)
        seen.add(rule.id)


def _str_list(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError("expected a list of strings", path=path)
    return tuple(value)


@dataclass(frozen=True, slots=True)
class SecretsPolicy:
    """The ``secrets`` config section: what to add to, except from, or disable in the rule pack."""

    enabled: bool = True
    extra_rules: tuple[SecretRule, ...] = ()
    allow: tuple[str, ...] = ()
    allow_values: tuple[str, ...] = ()
    disable: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_mapping(cls, data: Any, path: str = "sanitize.secrets",
                     base: SecretsPolicy | None = None) -> SecretsPolicy:
        """Parse a section; with ``base``, the section extends it (lists append, ``enabled`` replaces)."""
        base = base or cls()
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", path=path)
        unknown = set(data) - _POLICY_KEYS
        if unknown:
            raise ConfigError(f"unknown key(s): {', '.join(sorted(map(str, unknown)))}", path=path)
        enabled = data.get("enabled", base.enabled)
        if not isinstance(enabled, bool):
            raise ConfigError("expected true or false", path=f"{path}.enabled")
        extra_raw = data.get("extra_rules", [])
        if not isinstance(extra_raw, list):
            raise ConfigError("expected a list of rules", path=f"{path}.extra_rules")
        extra = tuple(SecretRule.from_mapping(r, f"{path}.extra_rules[{i}]") for i, r in enumerate(extra_raw))
        allow = _str_list(data.get("allow", []), f"{path}.allow")
        for i, pattern in enumerate(allow):
            compile_any(pattern, f"{path}.allow[{i}]")
        values = _str_list(data.get("allow_values", []), f"{path}.allow_values")
        disable = _str_list(data.get("disable", []), f"{path}.disable")
        policy = cls(enabled, base.extra_rules + extra, base.allow + allow, base.allow_values + values,
                     base.disable | frozenset(disable))
        known = {r.id for r in (*rule_pack(), *policy.extra_rules)}
        for rule_id in disable:
            if rule_id not in known:
                raise ConfigError(f"unknown rule id '{rule_id}'", path=f"{path}.disable")
        _check_unique((*rule_pack(), *policy.extra_rules), f"{path}.extra_rules")
        return policy

    def rules(self) -> tuple[SecretRule, ...]:
        return tuple(r for r in (*rule_pack(), *self.extra_rules) if r.id not in self.disable)


# A member as JSON text shows it: "<key>": "<value>".
_OPEN, _BETWEEN, _CLOSE = '"', '": "', '"'


def member_text(key: str, value: str) -> str:
    """A string value under an object key as the rules see it: the member as JSON text shows it, unescaped.

    Rules such as ``generic-secret`` or ``gcp-service-account-key-id`` need the key before the value; parsed JSON
    hands the two over apart. The value starts at ``value_offset(key)``; escaping is left out so that a span of
    the member maps back onto the value character for character.
    """
    return f"{_OPEN}{key}{_BETWEEN}{value}{_CLOSE}"


def value_offset(key: str) -> int:
    return len(_OPEN) + len(key) + len(_BETWEEN)


def members_text(flat: Sequence[str]) -> str:
    """The ``member_text`` of each (key, value) of ``flat`` (key, value, key, value...) run together, for a
    prescan: each is a slice with a non-word character on either side (``PatternSet.may_match_joined``), and one
    join builds them all. A match across two members is a false positive, which only costs the per-string passes.
    """
    return _OPEN + _BETWEEN.join(flat) + _CLOSE


def shannon_entropy(value: str) -> float:
    """Bits per character of ``value``'s own character distribution."""
    if not value:
        return 0.0
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


class Redactor:
    """Compiled redaction for one ``SecretsPolicy``. Immutable; share it between calls."""

    __slots__ = ("_allow", "_allow_values", "_ids", "_min_entropy", "_set")

    def __init__(self, rules: Sequence[SecretRule], allow: Sequence[str] = (),
                 allow_values: Iterable[str] = ()) -> None:
        self._ids = tuple(r.id for r in rules)
        self._min_entropy = tuple(r.min_entropy for r in rules)
        self._set = PatternSet([r.pattern for r in rules], path="sanitize.secrets.rules")
        self._allow = tuple(compile_any(p, "sanitize.secrets.allow") for p in allow)
        self._allow_values = frozenset(allow_values)

    @classmethod
    def from_policy(cls, policy: SecretsPolicy) -> Redactor:
        return cls(policy.rules() if policy.enabled else (), policy.allow, policy.allow_values)

    @property
    def rule_ids(self) -> tuple[str, ...]:
        return self._ids

    @property
    def fallback_count(self) -> int:
        """Rules running on Python ``re`` because RE2 cannot compile them."""
        return self._set.fallback_count

    def may_match(self, text: str) -> bool:
        return bool(self._ids) and self._set.may_match(text)

    def may_match_joined(self, text: str) -> bool:
        """``may_match`` for strings joined by separators (``PatternSet.may_match_joined``)."""
        return bool(self._ids) and self._set.may_match_joined(text)

    def redact(self, text: str, key: str | None = None) -> tuple[str, Mapping[str, int]]:
        """``text`` with every secret replaced by ``[REDACTED:<rule-id>]``, and counts keyed ``secret:<rule-id>``.

        ``key``: ``text`` is a string value under that object key (cleaned as the value is). The rules then also
        run on the member (``member_text``), and what a hit there covers of the value is redacted as well, so
        ``{"password": "..."}`` parsed from JSON loses what the same text unparsed would. A hit is judged
        (``min_entropy``, allow lists) on its whole span, as in the text; only its part inside the value is
        replaced (a rule with no ``secret`` group may take the key name along, and keys are never rewritten).
        The value's own hits still count: an anchored admin rule matches it only alone.
        """
        if not self._ids:
            return text, NO_COUNTS
        if key is None or not text:
            hits = self._set.hits(text, self._acceptor(text))
        else:
            member = member_text(key, text)
            # One relaxed RE2 pass over the member says which rules can occur in it, in the value alone or in
            # the key alone (``PatternSet.candidates_relaxed``): the same one pass a value alone costs.
            candidates = self._set.candidates_relaxed(member)
            if not candidates:
                return text, NO_COUNTS
            hits = self._set.hits(text, self._acceptor(text), candidates)
            start = value_offset(key)
            end = start + len(text)
            in_member = self._acceptor(member)

            def in_value(hit: Hit) -> bool:
                return hit.start < end and hit.end > start and in_member(hit)

            extra = self._set.hits(member, in_value, candidates)
            if extra:
                hits = non_overlapping([*hits, *(Hit(h.index, max(h.start, start) - start,
                                                     min(h.end, end) - start) for h in extra)])
        if not hits:
            return text, NO_COUNTS
        parts: list[str] = []
        counts: dict[str, int] = {}
        pos = 0
        for hit in hits:
            rule_id = self._ids[hit.index]
            parts.append(text[pos:hit.start])
            parts.append(f"[REDACTED:{rule_id}]")
            pos = hit.end
            name = f"secret:{rule_id}"
            counts[name] = counts.get(name, 0) + 1
        parts.append(text[pos:])
        return "".join(parts), counts

    def _acceptor(self, text: str) -> Callable[[Hit], bool]:
        """Whether a hit in ``text`` is redacted: not an allowed value, and entropic enough for its rule."""

        def accept(hit: Hit) -> bool:
            value = text[hit.start:hit.end]
            if value in self._allow_values or any(p.fullmatch(value) for p in self._allow):
                return False
            threshold = self._min_entropy[hit.index]
            return threshold is None or shannon_entropy(value) >= threshold

        return accept
