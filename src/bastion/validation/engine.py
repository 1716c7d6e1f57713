"""jsonschema, made safe to run on untrusted schemas.

Each supported dialect gets a validator class (built once, at import) that differs from jsonschema's in three ways:

- ``pattern``, ``patternProperties`` and ``additionalProperties`` match with RE2 (linear time) instead of ``re``,
  and ``uniqueItems`` hashes instead of comparing pairs;
- every keyword spends one step of a per-validation budget, so composition or recursive ``$ref`` blow-ups stop;
- ``format`` uses the cheap checker of ``formats.py``.

Per-validation state (the budget and the tool's precompiled patterns) travels in a ``ContextVar``: jsonschema builds
a new validator object for every subschema it descends into, so the validator cannot carry it, and the classes stay
shared and immutable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend
from jsonschema_specifications import REGISTRY as SPECIFICATIONS  # type: ignore[import-untyped]
from referencing import Registry, Resource, Specification
from referencing.exceptions import NoSuchResource
from referencing.jsonschema import DRAFT4, DRAFT6, DRAFT7, DRAFT201909, DRAFT202012

from bastion.validation.formats import build_format_checker
from bastion.validation.metaschema import compile_metaschema
from bastion.validation.regex import compile_pattern

Keyword = Callable[[Any, Any, Any, Any], Any]


class BudgetExhausted(Exception):
    """The validation spent its step budget. Internal: mapped to a violation by ``compile.py``."""


@dataclass(slots=True)
class Run:
    """State of one validation: the steps left and the tool's compiled patterns."""

    patterns: Mapping[str, Any]
    steps_left: int

    def spend(self, steps: int) -> None:
        self.steps_left -= steps
        if self.steps_left < 0:
            raise BudgetExhausted

    def regex(self, pattern: str) -> Any:
        compiled = self.patterns.get(pattern)
        # A pattern the compile-time scan did not see (reached only through a JSON-pointer $ref into a
        # non-keyword location) is compiled here, still with RE2; it may raise UnsupportedPattern.
        return compiled if compiled is not None else compile_pattern(pattern)


CURRENT_RUN: ContextVar[Run | None] = ContextVar("bastion_validation_run", default=None)


def _regex(pattern: str) -> Any:
    run = CURRENT_RUN.get()
    return run.regex(pattern) if run is not None else compile_pattern(pattern)


def _refuse(uri: str) -> Resource[Any]:
    # Never fetch: no network, no file. Any $ref that is not inside the schema is unresolvable.
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


REFUSING_REGISTRY: Registry[Any] = Registry(retrieve=_refuse)  # type: ignore[call-arg]
# What a validator built with ``registry=REFUSING_REGISTRY`` resolves against (jsonschema adds the metaschemas),
# combined once instead of once per validator.
ROOTED_REGISTRY: Registry[Any] = SPECIFICATIONS.combine(REFUSING_REGISTRY)


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and _regex(pattern).search(instance) is None:
        yield ValidationError("does not match pattern")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = _regex(pattern)
        for key, value in instance.items():
            if regex.search(key) is not None:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra_schema: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = additional_keys(instance, schema)
    if validator.is_type(extra_schema, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra_schema, path=key)
    elif extra_schema is False and extras:
        yield ValidationError("additional properties are not allowed")


def _properties(validator: Any, properties: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for name, subschema in properties.items():
        if name not in instance:
            continue
        if subschema is False:
            # jsonschema's descend drops the path for a false subschema; keep it, so the report can say where.
            # validator=None marks a false schema, as jsonschema itself does (its stubs do not admit it).
            error = ValidationError("not allowed", validator=None,  # type: ignore[arg-type]
                                    validator_value=None, instance=instance[name], schema=False)
            error.path.appendleft(name)
            error.relative_schema_path.appendleft(name)
            yield error
        else:
            yield from validator.descend(instance[name], subschema, path=name, schema_path=name)


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    # jsonschema compares unsortable items (objects) pairwise: quadratic in the array's length. Hashing a
    # canonical form keeps it linear.
    if unique is True and validator.is_type(instance, "array"):
        seen: set[Any] = set()
        for item in instance:
            key = _canonical(item)
            if key in seen:
                yield ValidationError("has non-unique elements")
                return
            seen.add(key)


def _canonical(value: Any) -> Any:
    """A hashable form under which two JSON values are equal exactly when JSON Schema says they are
    (1 == 1.0, true != 1, object key order does not matter). Recursion is bounded by the argument depth limit."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_canonical(item) for item in value))
    if isinstance(value, Mapping):
        return ("object", frozenset((key, _canonical(item)) for key, item in value.items()))
    return ("other", repr(value))


def additional_keys(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Keys of ``instance`` that neither ``properties`` nor ``patternProperties`` of ``schema`` cover, in order."""
    properties = schema.get("properties", {})
    regexes = [_regex(pattern) for pattern in schema.get("patternProperties", {})]
    return [key for key in instance
            if key not in properties and not any(regex.search(key) is not None for regex in regexes)]


# Following a reference (lookup, new resolver, new validator) costs several times a plain keyword; weighting it
# keeps the budget close to a time budget (about 2 µs a step) even for reference-heavy schemas.
_STEP_COST = {"$ref": 8, "$dynamicRef": 8, "$recursiveRef": 8}


def step_cost(keyword: str) -> int:
    """The steps one evaluation of ``keyword`` spends (``fast.py`` counts them exactly as the validators spend)."""
    return _STEP_COST.get(keyword, 1)


def _metered(keyword: Keyword, cost: int) -> Keyword:
    # ``wraps`` keeps the implementation reachable (``__wrapped__``): the fast path recognises a keyword by the
    # function jsonschema would run for it, so a dialect or a jsonschema release that implements a keyword
    # differently is never mistaken for the variant the fast path reproduces.
    @functools.wraps(keyword)
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        current = CURRENT_RUN.get()
        if current is not None:
            current.spend(cost)
        return keyword(validator, value, instance, schema)

    return run


_RE2_KEYWORDS: dict[str, Keyword] = {
    "pattern": _pattern,
    "properties": _properties,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}

FORMAT_CHECKER = build_format_checker()


def _safe_class(base: Any) -> Any:
    keywords = {name: _metered(_RE2_KEYWORDS.get(name, fn), step_cost(name))
                for name, fn in base.VALIDATORS.items()}
    # No ``version``: that would register the class in jsonschema's global dialect table.
    safe = extend(base, validators=keywords, format_checker=FORMAT_CHECKER)  # type: ignore[no-untyped-call]
    safe.evolve = _pinned_evolve(safe)
    return safe


def _pinned_evolve(cls: Any) -> Callable[..., Any]:
    """jsonschema's ``evolve``, except that the new validator is always of class ``cls``.

    jsonschema builds a validator for every subschema it enters, and picks its class by the subschema's
    ``$schema``: a URI it knows (a ``$schema`` below the root, or the root's own when ``$ref: "#"`` enters the root
    again, as recursive draft-07 schemas do) switches to jsonschema's stock class, which matches ``pattern`` with
    Python's backtracking ``re`` and spends no step of the budget. bastion reads a schema in one dialect, the one
    its root declares (its metaschema check and its scan used that one), so the safe class is kept throughout.
    """
    # The validator's constructor arguments, as jsonschema's own ``evolve`` copies them (attrs fields).
    fields = [(field.name, field.alias) for field in cls.__attrs_attrs__ if field.init]

    def evolve(self: Any, **changes: Any) -> Any:
        changes.setdefault("schema", self.schema)
        for name, alias in fields:
            if alias not in changes:
                changes[alias] = getattr(self, name)
        return cls(**changes)

    return evolve


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    validator_class: Any
    specification: Specification[Any]
    # Whether unevaluatedProperties exists in this dialect; jsonschema evaluates its patternProperties with ``re``.
    has_unevaluated: bool
    # The metaschema compiled to a predicate (``metaschema.py``): True means ``check_schema`` would pass; anything
    # else, or None (not compiled), means ask ``check_schema``.
    valid_schema: Callable[[Any], bool] | None = None


def _dialects() -> dict[str, Dialect]:
    table = [
        ("json-schema.org/draft/2020-12/schema", "2020-12", Draft202012Validator, DRAFT202012, True),
        ("json-schema.org/draft/2019-09/schema", "2019-09", Draft201909Validator, DRAFT201909, True),
        ("json-schema.org/draft-07/schema", "draft-07", Draft7Validator, DRAFT7, False),
        ("json-schema.org/draft-06/schema", "draft-06", Draft6Validator, DRAFT6, False),
        ("json-schema.org/draft-04/schema", "draft-04", Draft4Validator, DRAFT4, False),
    ]
    dialects = {}
    for key, name, base, spec, unevaluated in table:
        safe = _safe_class(base)
        dialects[key] = Dialect(name, safe, spec, unevaluated, compile_metaschema(safe))
    return dialects


DIALECTS: Mapping[str, Dialect] = _dialects()
DEFAULT_DIALECT = DIALECTS["json-schema.org/draft/2020-12/schema"]


def dialect_key(uri: str) -> str:
    """Normalise a ``$schema`` URI: scheme and empty fragment do not matter (``http://...draft-07/schema#``)."""
    key = uri.strip()
    for prefix in ("https://", "http://"):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    return key.removesuffix("#")
