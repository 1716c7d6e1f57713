"""The fast path against jsonschema, in every dialect: same verdicts, same steps, same reports.

Random schemas of each dialect (the supported keywords, references, branches, annotations, and unsupported
keywords mixed in), random values and values drawn from the schema itself (so that many are valid, and many
nearly so). For each value the compiled root must agree with jsonschema, run under bastion's metered validator:

- ``check`` (the hot path): when it proves a value valid, jsonschema finds no error and spends the same steps;
- ``settle``: whenever it answers, the same verdict and steps as ``list(iter_errors)`` (``lazy=False``) and as
  ``next(iter_errors)`` (``lazy=True``);
- ``CompiledSchema.validate`` with and without the fast path: identical reports, under small budgets too.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.validation import SchemaLimits
from bastion.validation.compile import CompiledSchema, compile_schema
from bastion.validation.engine import CURRENT_RUN, DEFAULT_DIALECT, DIALECTS, Run, dialect_key
from bastion.validation.fast import compile_node

LIMITS = SchemaLimits()
URIS = {
    "2020-12": "https://json-schema.org/draft/2020-12/schema",
    "2019-09": "https://json-schema.org/draft/2019-09/schema",
    "draft-07": "http://json-schema.org/draft-07/schema#",
    "draft-06": "http://json-schema.org/draft-06/schema#",
    "draft-04": "http://json-schema.org/draft-04/schema#",
}
_HUGE = 10**9


def jsonschema_outcome(schema: CompiledSchema, value: Any, lazy: bool) -> int | None:
    """What the metered validator finds, coded as the fast path codes outcomes (``n`` valid, ``~n`` invalid, after
    ``n`` steps); None if it raises. ``lazy``: stop at the first error, as ``is_valid`` does."""
    run = Run(schema._patterns, _HUGE)
    token = CURRENT_RUN.set(run)
    try:
        errors = schema._validator.iter_errors(value)
        found = next(errors, None) is not None if lazy else bool(list(errors))
    except Exception:
        return None
    finally:
        CURRENT_RUN.reset(token)
    spent = _HUGE - run.steps_left
    return ~spent if found else spent


def root_of(schema: dict[str, Any], compiled: CompiledSchema) -> Any:
    declared = schema.get("$schema")
    dialect = DEFAULT_DIALECT if declared is None else DIALECTS[dialect_key(declared)]
    return compile_node(schema, dialect, compiled._patterns)


def assert_agrees(schema: dict[str, Any], value: Any) -> str:
    """Assert the fast path agrees with jsonschema on ``value``; say what the fast path answered."""
    compiled = compile_schema(schema, LIMITS, "inputSchema")
    root = root_of(schema, compiled)
    if root is None:
        return "unsupported"
    full = jsonschema_outcome(compiled, value, lazy=False)
    steps = root.check(value)
    if steps >= 0:
        assert full == steps, (full, steps)
    settled = root.settle(value, False)
    if settled is not None:
        assert settled == full, (settled, full)
    lazy = root.settle(value, True)
    if lazy is not None:
        assert lazy == jsonschema_outcome(compiled, value, lazy=True)
    if steps >= 0:
        return "valid"
    return "settled" if settled is not None else "unknown"


# -- schemas ---------------------------------------------------------------------------------------------------

_names = st.sampled_from(["a", "b", "c", "text", "n"])
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from([0.0, 1.0, 1.5, -2.5]),
                     st.sampled_from(["", "a", "ab", "abc", "x@y", "2024-02-29", "ABC"]))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(_names, inner, max_size=4)), max_leaves=12)
_types = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array"])


def _json_key(value: Any) -> Any:
    # Equality as JSON Schema's ``equal`` sees it (1 == 1.0, true != 1): draft-04 wants unique enums.
    return ("number", float(value)) if type(value) in (int, float) else (type(value).__name__, value)


def _leaf(dialect: str) -> st.SearchStrategy[dict[str, Any]]:
    draft4 = dialect == "draft-04"
    exclusive = st.booleans() if draft4 else st.integers(-3, 3)
    keywords = st.fixed_dictionaries({}, optional={
        "type": st.one_of(_types, st.lists(_types, min_size=1, max_size=3, unique=True)),
        "enum": st.lists(st.one_of(_scalars, st.just([1]), st.just({"a": 1})), min_size=1, max_size=4,
                         unique_by=lambda v: repr(_json_key(v))),
        "const": st.one_of(_scalars, st.just([1, "a"])),  # not a keyword in draft-04: ignored there
        "minimum": st.integers(-3, 3), "maximum": st.sampled_from([0, 2, 2.5]),
        "exclusiveMinimum": exclusive, "exclusiveMaximum": exclusive,
        "minLength": st.integers(0, 3), "maxLength": st.integers(0, 3),
        "minItems": st.integers(0, 2), "maxItems": st.integers(0, 3),
        "minProperties": st.integers(0, 2), "maxProperties": st.integers(0, 3),
        "pattern": st.sampled_from(["^a", "b$", "[A-Z]"]),
        "format": st.sampled_from(["email", "date", "uuid", "no-such-format"]),
        "required": st.lists(_names, min_size=1 if draft4 else 0, max_size=3, unique=True),
        "title": st.just("a title"), "description": st.just("d"), "default": _scalars,
        "examples": st.lists(_scalars, max_size=2), "deprecated": st.booleans(), "readOnly": st.booleans(),
    })
    if draft4:
        # Draft-04's boolean exclusives depend on the bound they modify (its metaschema says so).
        return keywords.map(lambda s: {k: v for k, v in s.items()
                                       if not (k == "exclusiveMinimum" and "minimum" not in s)
                                       and not (k == "exclusiveMaximum" and "maximum" not in s)})
    return keywords


def _defs_key(dialect: str) -> str:
    return "$defs" if dialect in ("2020-12", "2019-09") else "definitions"


def _schemas(dialect: str) -> st.SearchStrategy[dict[str, Any]]:
    draft4 = dialect == "draft-04"
    defs = _defs_key(dialect)
    # Definition d1 refers to nothing, d0 may refer to d1, the root's body to either (and now and then to the root
    # itself: a cycle, left to jsonschema).
    to_d1 = st.just(f"#/{defs}/d1")
    anywhere = st.sampled_from([f"#/{defs}/d0", f"#/{defs}/d1"] * 4 + ["#"])

    def nest(refs: st.SearchStrategy[str] | None) -> Any:
        def build(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
            branches = st.lists(inner, min_size=1, max_size=3)
            applicators: dict[str, st.SearchStrategy[Any]] = {
                "properties": st.dictionaries(_names, inner, max_size=3),
                "additionalProperties": st.one_of(st.booleans(), inner),
                "items": inner,
                "anyOf": branches, "oneOf": branches, "allOf": branches,
            }
            if refs is not None:
                applicators["$ref"] = refs
            # Outside the subset, now and then: such schemas must be left alone, and reports must not change.
            unsupported: list[st.SearchStrategy[dict[str, Any]]] = [
                st.builds(lambda s: {"not": s}, inner), st.just({"uniqueItems": True}),
                st.builds(lambda s: {"patternProperties": {"^a": s}}, inner)]
            if dialect != "2020-12":
                unsupported.append(st.builds(lambda s: {"items": [s]}, inner))  # the tuple form
            rare = st.integers(0, 15).flatmap(lambda roll: st.one_of(*unsupported) if roll == 7 else st.just({}))
            return st.tuples(_leaf(dialect), st.fixed_dictionaries({}, optional=applicators), rare).map(
                lambda parts: {**parts[0], **parts[1], **parts[2]})

        return build

    # Draft-04 has no boolean schemas; later dialects do, as subschemas.
    leaves = _leaf(dialect) if draft4 else st.one_of(st.booleans(), _leaf(dialect))

    def tree(refs: st.SearchStrategy[str] | None) -> st.SearchStrategy[Any]:
        return st.recursive(leaves, nest(refs), max_leaves=6)

    definitions = st.fixed_dictionaries({"d0": tree(to_d1), "d1": tree(None)})

    def root(parts: tuple[dict[str, Any], dict[str, Any], bool]) -> dict[str, Any]:
        body, found, declare = parts
        schema = {**body, defs: found}
        if declare or dialect != "2020-12":
            schema["$schema"] = URIS[dialect]
        return schema

    return st.tuples(nest(anywhere)(tree(anywhere)), definitions, st.booleans()).map(root)


# -- values drawn from a schema ------------------------------------------------------------------------------

_STRINGS = ["", "a", "ab", "abc", "ABC", "xb", "x@y", "2024-02-29", "12345678-1234-5678-1234-567812345678"]


def sample(schema: Any, root: dict[str, Any], rng: random.Random, depth: int = 0) -> Any:
    """A value shaped by ``schema``: often valid, often nearly so."""
    if not isinstance(schema, dict) or depth > 5:
        return rng.choice([None, True, 0, 1.0, "a", [], {}])
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and rng.random() < 0.9:
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return sample(target, root, rng, depth + 1)
    for keyword in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(keyword), list) and rng.random() < 0.6:
            return sample(rng.choice(schema[keyword]), root, rng, depth + 1)
    if "const" in schema and rng.random() < 0.7:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and rng.random() < 0.8:
        return rng.choice(schema["enum"])
    declared = schema.get("type")
    kind = rng.choice(declared) if isinstance(declared, list) else declared
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else rng.choice(
            ["string", "integer", "number", "null", "boolean"])
    if kind == "object":
        out = {}
        required = schema.get("required", [])
        for name, sub in (schema.get("properties") or {}).items():
            if name in required or rng.random() < 0.7:
                out[name] = sample(sub, root, rng, depth + 1)
        for name in required:
            out.setdefault(name, rng.choice(["a", 1, None]))
        if rng.random() < 0.3:
            extra = schema.get("additionalProperties")
            out["zz"] = sample(extra, root, rng, depth + 1) if isinstance(extra, dict) else 1
        return out
    if kind == "array":
        items = schema.get("items")
        return [sample(items, root, rng, depth + 1) if isinstance(items, dict) else rng.choice([1, "a"])
                for _ in range(rng.randint(0, 3))]
    if kind == "string":
        return rng.choice(_STRINGS)
    if kind == "integer":
        return rng.choice([-3, -1, 0, 1, 2, 3, 2.0, 5])
    if kind == "number":
        return rng.choice([-2.5, 0, 0.5, 1, 2, 2.5, 3])
    if kind == "boolean":
        return rng.choice([True, False])
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), dialect=st.sampled_from(sorted(URIS)), rng=st.randoms(use_true_random=False),
       values=st.lists(_values, max_size=3))
def test_fast_path_agrees_with_jsonschema_in_every_dialect(data: st.DataObject, dialect: str, rng: random.Random,
                                                           values: list[Any]) -> None:
    schema = data.draw(_schemas(dialect))
    for value in [*values, *(sample(schema, schema, rng) for _ in range(6))]:
        assert_agrees(schema, value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), dialect=st.sampled_from(sorted(URIS)), rng=st.randoms(use_true_random=False),
       budget=st.sampled_from([5, 20, 100_000]))
def test_fast_path_reports_equal_jsonschemas(data: st.DataObject, dialect: str, rng: random.Random,
                                             budget: int) -> None:
    schema = data.draw(_schemas(dialect))
    limits = dataclasses.replace(LIMITS, max_validation_steps=budget)
    fast = compile_schema(schema, limits, "inputSchema")
    plain = dataclasses.replace(fast, _fast=None)
    for _ in range(6):
        value = sample(schema, schema, rng)
        assert fast.validate(value) == plain.validate(value)
