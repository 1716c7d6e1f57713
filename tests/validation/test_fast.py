"""The fast path for simple schemas: it only ever proves values valid, and then jsonschema agrees.

Examples of what takes the fast path and what does not, dialect by dialect; the property tests comparing it with
jsonschema on random schemas and values are in ``test_fast_differential.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bastion.validation import SchemaLimits, compile_tool
from bastion.validation.compile import CompiledSchema, compile_schema
from bastion.validation.engine import DEFAULT_DIALECT
from bastion.validation.fast import MAX_FAST_DEPTH, _Compiler
from tests.validation.test_fast_differential import jsonschema_outcome

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


DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT4 = "http://json-schema.org/draft-04/schema#"


@pytest.mark.parametrize("schema", [
    {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
    {"oneOf": [{"const": "fast"}, {"type": "integer", "minimum": 1}], "allOf": [True]},
    {"$schema": DRAFT7, "type": "string"},
    {"$schema": DRAFT7, "type": "array", "items": {"type": "integer"}, "definitions": {"x": {}}},
    {"$schema": "http://json-schema.org/draft-06/schema#", "exclusiveMinimum": 0},
    {"$schema": DRAFT4, "type": "integer", "minimum": 0, "exclusiveMinimum": True},
    {"$schema": "https://json-schema.org/draft/2019-09/schema", "items": False},
])
def test_dialects_references_and_branches_get_a_fast_path(schema: Any) -> None:
    assert fast_of(compiled(schema)) is not None


@pytest.mark.parametrize("schema", [
    {"type": "array", "prefixItems": [{"type": "string"}], "items": False},
    {"$schema": DRAFT7, "type": "array", "items": [{"type": "string"}]},  # the tuple form
    {"$schema": DRAFT4, "items": [{"type": "string"}]},
    {"type": "object", "patternProperties": {"^x": {"type": "string"}}, "additionalProperties": False},
    {"uniqueItems": True},
    {"multipleOf": 0.1},
    {"not": {"type": "string"}},
    {"properties": {"next": {"$ref": "#"}}},  # recursive
    {"$defs": {"a": {"items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"},
    {"properties": {"a": {"$schema": DRAFT7, "type": "string"}}},  # jsonschema switches validator class
    {"oneOf": [{"$id": "https://example.org/s", "type": "string"}, {"type": "null"}]},
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


def test_enum_compares_as_jsonschema_does() -> None:
    schema = compiled({"enum": [1, "a", [1]]})
    fast = fast_of(schema)
    assert fast is not None
    assert fast(1.0) == 1 and schema.validate(1.0).ok  # 1.0 equals 1
    assert fast(True) == -1 and not schema.validate(True).ok  # ... but true does not
    assert fast([1]) == -1 and schema.validate([1]).ok  # containers: jsonschema decides


def test_tool_validators_use_the_fast_path() -> None:
    tool = compile_tool({"inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
                         "outputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                                          "required": ["text"]}}, LIMITS)
    assert fast_of(tool.input) is not None
    assert tool.output is not None and fast_of(tool.output) is not None


def proven(schema: CompiledSchema, value: Any) -> int:
    """The steps the fast path proves ``value`` valid in, asserting jsonschema agrees on verdict and steps."""
    fast = fast_of(schema)
    assert fast is not None
    steps = fast(value)
    assert steps >= 0
    assert jsonschema_outcome(schema, value, lazy=False) == steps
    return steps


# The official TypeScript SDK (zod) writes every tool schema like this, input and output alike.
TS_SDK = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
          "additionalProperties": False, "$schema": DRAFT7}


def test_the_typescript_sdks_draft_07_schemas_take_the_fast_path() -> None:
    schema = compiled(TS_SDK)
    assert proven(schema, {"text": "hello"}) == 5  # type, properties, required, additionalProperties; string
    assert fast_of(schema)({"text": 1}) == -1
    assert schema.validate({"text": 1}).violations == ("$.text: must be of type string",)


# What FastMCP / the Python SDK (pydantic) write: titles, defaults, Optional as anyOf with null, models in $defs.
PYDANTIC = {
    "type": "object", "title": "searchArguments",
    "properties": {
        "query": {"type": "string", "title": "Query"},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Limit"},
        "filter": {"anyOf": [{"$ref": "#/$defs/Filter"}, {"type": "null"}], "default": None},
        "mode": {"$ref": "#/$defs/Mode", "default": "fast"},
    },
    "required": ["query"],
    "$defs": {
        "Filter": {"type": "object", "title": "Filter", "additionalProperties": False,
                   "properties": {"tag": {"type": "string", "title": "Tag", "examples": ["x"]}}},
        "Mode": {"enum": ["fast", "safe"], "title": "Mode", "type": "string"},
    },
}


def test_pydantic_schemas_take_the_fast_path() -> None:
    schema = compiled(PYDANTIC)
    assert proven(schema, {"query": "q"}) == 3 + 1  # type, properties, required; the query's type
    # limit: anyOf (1) + first branch (1); filter: anyOf (1) + $ref (8) + Filter's 3 keywords + tag's type (1)
    assert proven(schema, {"query": "q", "limit": 3, "filter": {"tag": "t"}}) == 4 + 2 + 13
    # a null filter: the $ref branch fails first (8 + 3: jsonschema evaluates it in full), then null passes (1)
    assert proven(schema, {"query": "q", "filter": None}) == 4 + 1 + 11 + 1
    assert proven(schema, {"query": "q", "mode": "safe"}) == 4 + 8 + 2
    assert not schema.validate({"query": "q", "mode": "slow"}).ok


def test_draft_04_integers_and_exclusive_bounds() -> None:
    draft4 = compiled({"$schema": DRAFT4, "type": "integer", "maximum": 5, "exclusiveMaximum": True})
    draft7 = compiled({"$schema": DRAFT7, "type": "integer", "maximum": 5, "exclusiveMaximum": 6})
    assert proven(draft4, 4) == 2  # exclusiveMaximum is no keyword of its own in draft-04: no step
    assert proven(draft7, 4.0) == 3 and proven(draft7, 5) == 3
    assert fast_of(draft4)(4.0) == -1 and not draft4.validate(4.0).ok  # draft-04: 4.0 is not an integer
    assert fast_of(draft4)(5) == -1 and not draft4.validate(5).ok


def test_draft_04_to_07_ignore_the_siblings_of_a_ref() -> None:
    body = {"$ref": "#/definitions/s", "type": "integer", "definitions": {"s": {"type": "string"}}}
    for uri in (DRAFT4, DRAFT7):
        assert proven(compiled({"$schema": uri, **body}), "x") == 8 + 1
    later = compiled({**body, "$defs": body["definitions"]})  # 2020-12 evaluates them
    assert fast_of(later)("x") == -1 and not later.validate("x").ok


def test_draft_04_ignores_const() -> None:
    assert proven(compiled({"$schema": DRAFT4, "const": "a", "type": "string"}), "b") == 1


@pytest.mark.parametrize("uri", [DRAFT4, DRAFT7, "https://json-schema.org/draft/2020-12/schema"])
def test_formats_assert_in_every_dialect(uri: str) -> None:
    schema = compiled({"$schema": uri, "type": "string", "format": "date"})
    assert proven(schema, "2024-02-29") == 2
    assert fast_of(schema)("2023-02-29") == -1
    assert schema.validate("2023-02-29").violations == ("$: must be a valid date",)


def test_one_of_fails_when_two_branches_pass() -> None:
    schema = compiled({"oneOf": [{"type": "integer"}, {"minimum": 0}]})
    assert proven(schema, -1) == 1 + 1 + 1  # the second branch is checked and fails
    assert fast_of(schema)(1) == -1 and not schema.validate(1).ok


def test_a_schema_referenced_from_many_places_is_compiled_once_per_depth() -> None:
    # Two references per level, seven levels (the depth limit allows no more): 128 paths to d0, compiled as 23
    # nodes: the root, d0, and per level the definition and its two properties holding a reference.
    defs: dict[str, Any] = {"d0": {"type": "string"}}
    for level in range(1, 8):
        defs[f"d{level}"] = {"properties": {"a": {"$ref": f"#/$defs/d{level - 1}"},
                                            "b": {"$ref": f"#/$defs/d{level - 1}"}}}
    document = {"$ref": "#/$defs/d7", "$defs": defs}
    compiler = _Compiler(DEFAULT_DIALECT, {})
    compiler.root(document)
    assert len(compiler._done) == 2 + 7 * 3
    assert proven(compiled(document), {"a": {"b": {}}}) == 8 + 1 + 8 + 1 + 8 + 1
