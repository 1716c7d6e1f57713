"""The fast path for simple schemas: it only ever proves values valid, and then jsonschema agrees.

The differential property test compares every validation with the fast path against the same validation by
jsonschema alone, over random schemas of the supported subset (with unsupported keywords mixed in) and random
values; reports must be identical, budget exhaustion included.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.validation import SchemaLimits, compile_tool
from bastion.validation.compile import CompiledSchema, compile_schema
from bastion.validation.fast import MAX_FAST_DEPTH

LIMITS = SchemaLimits()


def compiled(schema: Any, limits: SchemaLimits = LIMITS) -> CompiledSchema:
    return compile_schema(schema, limits, "inputSchema")



def fast_of(schema: Any) -> Any:
    """The schema's fast check, compiled on demand as validation compiles it (None: left to jsonschema)."""
    return schema._fast.get() if schema._fast is not None else None

def slow(schema: CompiledSchema) -> CompiledSchema:
    return dataclasses.replace(schema, _fast=None)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 10}},
     "additionalProperties": False, "title": "t", "description": "d", "$defs": {"x": {"type": "string"}}},
    {"type": "array", "items": {"enum": ["a", "b", 1, None]}, "minItems": 1, "maxItems": 3},
    {"type": "string", "pattern": "^[a-z]+$", "format": "email", "minLength": 1, "maxLength": 9},
    {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
     "additionalProperties": {"type": ["number", "null"]}, "minProperties": 1, "maxProperties": 4},
    {"items": True, "additionalProperties": True},
    {"properties": {"never": False, "always": True}, "const": {"a": 1}},
])
def test_simple_shapes_get_a_fast_path(schema: Any) -> None:
    assert fast_of(compiled(schema)) is not None


@pytest.mark.parametrize("schema", [
    {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
    {"type": "array", "prefixItems": [{"type": "string"}], "items": False},
    {"type": "object", "patternProperties": {"^x": {"type": "string"}}, "additionalProperties": False},
    {"uniqueItems": True},
    {"multipleOf": 0.1},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"},
])
def test_other_shapes_are_left_to_jsonschema(schema: Any) -> None:
    assert fast_of(compiled(schema)) is None


def test_deep_schemas_are_left_to_jsonschema() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_FAST_DEPTH + 1):
        schema = {"type": "array", "items": schema}
    assert fast_of(compiled(schema)) is None


def test_valid_values_pass_and_invalid_ones_get_jsonschemas_report() -> None:
    schema = compiled({"type": "object", "properties": {"text": {"type": "string", "maxLength": 3}},
                       "required": ["text"], "additionalProperties": False})
    assert schema.validate({"text": "abc"}).ok
    assert schema.validate({"text": "abcd", "x": 1}).violations == (
        "$: unexpected property 'x'", "$.text: must be at most 3 characters long")
    assert schema.validate({}).violations == ("$: missing required property 'text'",)


def test_values_of_other_python_types_are_left_to_jsonschema() -> None:
    schema = compiled({"type": "array"})
    assert fast_of(schema) is not None
    assert fast_of(schema)((1, 2)) == -1  # a tuple is no JSON array to jsonschema either
    assert schema.validate((1, 2)) == slow(schema).validate((1, 2))


def test_the_step_budget_is_spent_as_jsonschema_spends_it() -> None:
    limits = dataclasses.replace(LIMITS, max_validation_steps=50)
    schema = compiled({"type": "array", "items": {"type": "integer", "minimum": 0}}, limits)
    assert fast_of(schema) is not None
    # 1 (type) + 1 (items) + 2 per item: 24 items spend 50 steps, 25 spend 52.
    assert schema.validate(list(range(24))).ok
    assert slow(schema).validate(list(range(24))).ok
    assert schema.validate(list(range(25))).violations == slow(schema).validate(list(range(25))).violations
    assert not schema.validate(list(range(25))).ok


def test_integers_equal_across_types_are_left_to_jsonschema() -> None:
    schema = compiled({"enum": [1, "a"]})
    assert fast_of(schema) is not None
    assert fast_of(schema)(1.0) == -1
    assert schema.validate(1.0).ok  # jsonschema: 1.0 equals 1
    assert not schema.validate(True).ok  # ... but true does not


def test_tool_validators_use_the_fast_path() -> None:
    tool = compile_tool({"inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
                         "outputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                                          "required": ["text"]}}, LIMITS)
    assert fast_of(tool.input) is not None
    assert tool.output is not None and fast_of(tool.output) is not None


# -- differential: the fast path never changes a report -----------------------------------------------------

_names = st.sampled_from(["a", "b", "c", "text", "n"])
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from([0.0, 1.0, 1.5, -2.5]),
                     st.sampled_from(["", "a", "ab", "abc", "x@y", "2024-02-29", "ABC"]))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(_names, inner, max_size=4)), max_leaves=12)
_types = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array"])


def _leaf_keywords() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={
        "type": st.one_of(_types, st.lists(_types, min_size=1, max_size=3, unique=True)),
        "enum": st.lists(_scalars, min_size=1, max_size=4),
        "const": _scalars,
        "minimum": st.integers(-3, 3), "maximum": st.sampled_from([0, 2, 2.5]),
        "exclusiveMinimum": st.integers(-3, 3), "exclusiveMaximum": st.integers(-3, 3),
        "minLength": st.integers(0, 3), "maxLength": st.integers(0, 3),
        "minItems": st.integers(0, 2), "maxItems": st.integers(0, 3),
        "minProperties": st.integers(0, 2), "maxProperties": st.integers(0, 3),
        "pattern": st.sampled_from(["^a", "b$", "[A-Z]"]),
        "format": st.sampled_from(["email", "date", "uuid", "no-such-format"]),
        "required": st.lists(_names, max_size=3, unique=True),
        "title": st.just("a title"),
        "uniqueItems": st.booleans(),  # outside the subset: such schemas must be left alone
    })


def _schemas() -> st.SearchStrategy[Any]:
    def nest(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.tuples(_leaf_keywords(), st.fixed_dictionaries({}, optional={
            "properties": st.dictionaries(_names, inner, max_size=3),
            "additionalProperties": st.one_of(st.booleans(), inner),
            "items": inner,
        })).map(lambda parts: {**parts[0], **parts[1]})

    # A tool's schema is an object; true and false appear as subschemas.
    return nest(st.recursive(st.one_of(st.booleans(), _leaf_keywords()), nest, max_leaves=6))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas(), values=st.lists(_values, min_size=1, max_size=5),
       budget=st.sampled_from([5, 20, 100_000]))
def test_fast_path_reports_equal_jsonschemas(schema: Any, values: list[Any], budget: int) -> None:
    limits = dataclasses.replace(LIMITS, max_validation_steps=budget)
    fast = compiled(schema, limits)
    plain = slow(fast)
    for value in values:
        expected = plain.validate(value)
        assert fast.validate(value) == expected
        if fast_of(fast) is not None and fast_of(fast)(value) >= 0:
            # The fast path proved it valid: jsonschema agrees, within the same budget.
            assert expected.ok or fast_of(fast)(value) > budget
