"""The compiled metaschemas: whatever they accept, jsonschema's ``check_schema`` accepts (the property), and they
accept the ordinary schemas real tools declare (or they would save nothing).

The property runs on generated schema-shaped values: every keyword of every supported dialect, with values that
are sometimes right and sometimes not, nested where subschemas go. A schema the predicate rejects is fine either
way (``compile_schema`` asks jsonschema then); one it accepts and jsonschema refuses would be a hole.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema.exceptions import SchemaError

from bastion.validation.compile import SchemaRejected, compile_schema
from bastion.validation.engine import DIALECTS, Dialect
from bastion.validation.limits import SchemaLimits
from tests.support.catalogue_corpus import upstream_lists

DIALECT_LIST = list(DIALECTS.values())
KEYWORDS = sorted({"$ref", "$id", "id", "$anchor", "$dynamicAnchor", "$dynamicRef", "$recursiveRef", "$recursiveAnchor",
                   "$defs", "definitions", "$schema", "$comment", "$vocabulary", "type", "enum", "const",
                   "properties", "patternProperties", "additionalProperties", "propertyNames", "required",
                   "dependencies", "dependentRequired", "dependentSchemas", "items", "prefixItems",
                   "additionalItems", "contains", "minContains", "maxContains", "uniqueItems", "minItems", "maxItems",
                   "minLength", "maxLength", "minProperties", "maxProperties", "pattern", "format", "minimum",
                   "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "allOf", "anyOf", "oneOf",
                   "not", "if", "then", "else", "unevaluatedItems", "unevaluatedProperties", "title",
                   "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "contentEncoding",
                   "contentMediaType", "contentSchema"})
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2, allow_nan=False),
                    st.sampled_from(["string", "object", "array", "integer", "number", "boolean", "null", "strin",
                                     "#", "#/$defs/a", "#meta", "a b", "_x", "^a$", "(", "x", ""]))


def _json(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(children, max_size=3),
                     st.dictionaries(st.sampled_from(["a", "b", *KEYWORDS[:6]]), children, max_size=3))


VALUES = st.recursive(SCALARS, _json, max_leaves=8)


def _schemas(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keyword_value = st.one_of(VALUES, children, st.lists(children, max_size=3),
                              st.dictionaries(st.sampled_from(["a", "b", "c"]), children, max_size=3),
                              st.lists(st.sampled_from(["a", "b", "string", "integer"]), max_size=3))
    return st.dictionaries(st.sampled_from(KEYWORDS), keyword_value, max_size=5)


SCHEMAS = st.recursive(st.one_of(st.booleans(), st.dictionaries(st.sampled_from(KEYWORDS), VALUES, max_size=3)),
                       _schemas, max_leaves=12)


def _jsonschema_accepts(dialect: Dialect, schema: Any) -> bool:
    try:
        dialect.validator_class.check_schema(schema, format_checker=None)
    except SchemaError:
        return False
    return True


@pytest.mark.parametrize("dialect", DIALECT_LIST, ids=[d.name for d in DIALECT_LIST])
def test_every_supported_dialect_has_a_compiled_metaschema(dialect: Dialect) -> None:
    assert dialect.valid_schema is not None


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, index=st.integers(0, len(DIALECT_LIST) - 1))
def test_what_the_predicate_accepts_jsonschema_accepts(schema: Any, index: int) -> None:
    dialect = DIALECT_LIST[index]
    assert dialect.valid_schema is not None
    if dialect.valid_schema(schema):
        assert _jsonschema_accepts(dialect, schema), schema


# Refused by jsonschema only through a rule that reaches a nested subschema, an anchor pattern, a uniqueness
# check or a draft-specific keyword: the places a hand-compiled metaschema is most likely to be wrong.
INVALID = [
    {"type": 5},
    {"type": ["string", "string"]},
    {"properties": {"a": {"type": "strin"}}},
    {"properties": {"a": {"definitions": 5}}},
    {"properties": {"a": {"$defs": {"b": {"minItems": "x"}}}}},
    {"items": {"not": {"required": ["a", "a"]}}},
    {"required": ["a", "a"]},
    {"minLength": -1},
    {"multipleOf": 0},
    {"dependencies": {"a": 3}},
    {"allOf": []},
    {"anyOf": [{"maxItems": 1.5}]},
    {"additionalProperties": {"propertyNames": {"pattern": 3}}},
]


@pytest.mark.parametrize("dialect", DIALECT_LIST, ids=[d.name for d in DIALECT_LIST])
@pytest.mark.parametrize("schema", INVALID)
def test_schemas_jsonschema_refuses_are_never_passed(dialect: Dialect, schema: dict[str, Any]) -> None:
    assert dialect.valid_schema is not None
    if not _jsonschema_accepts(dialect, schema):
        assert not dialect.valid_schema(schema)


@pytest.mark.parametrize("schema", [{"$anchor": "a b"}, {"$defs": {"x": {"$dynamicAnchor": "9"}}},
                                    {"items": [{}]}, {"exclusiveMinimum": True}])
def test_2020_12_specific_rules_refuse(schema: dict[str, Any]) -> None:
    dialect = DIALECTS["json-schema.org/draft/2020-12/schema"]
    assert dialect.valid_schema is not None
    assert not _jsonschema_accepts(dialect, schema)
    assert not dialect.valid_schema(schema)


def test_draft_04_exclusive_minimum_is_a_modifier() -> None:
    dialect = DIALECTS["json-schema.org/draft-04/schema"]
    assert dialect.valid_schema is not None
    assert dialect.valid_schema({"minimum": 3, "exclusiveMinimum": True})
    assert not dialect.valid_schema({"exclusiveMinimum": True})  # needs minimum beside it
    assert not _jsonschema_accepts(dialect, {"exclusiveMinimum": True})


@pytest.mark.parametrize("dialect", DIALECT_LIST, ids=[d.name for d in DIALECT_LIST])
def test_real_tool_schemas_take_the_fast_path(dialect: Dialect) -> None:
    assert dialect.valid_schema is not None
    tools = [t for lists in upstream_lists(3, 30).values() for t in lists.tools]
    for tool in tools:
        for role in ("inputSchema", "outputSchema"):
            assert dialect.valid_schema(tool[role]), (dialect.name, tool[role])
            assert _jsonschema_accepts(dialect, tool[role])


def test_a_rejected_schema_keeps_jsonschemas_reason() -> None:
    with pytest.raises(SchemaRejected) as caught:
        compile_schema({"type": "object", "properties": {"a": {"type": "strin"}}}, SchemaLimits(), "inputSchema")
    assert caught.value.reason == "inputSchema is not a valid 2020-12 schema: at $.properties.a.type, fails 'anyOf'"


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=SCHEMAS, max_bytes=st.integers(10, 400), max_depth=st.integers(1, 6))
def test_one_walk_sizes_copies_and_finds_scan_keys_like_the_three_it_replaces(value: Any, max_bytes: int,
                                                                             max_depth: int) -> None:
    from bastion.validation.compile import _inspect, _plain
    from bastion.validation.limits import measure
    from bastion.validation.scan import SCAN_KEYS, _mentions

    if not isinstance(value, dict):
        return
    inspected = _inspect(value, max_bytes, max_depth)
    excess = measure(value, max_bytes=max_bytes, max_depth=max_depth)
    assert (inspected is None) == (excess is not None)
    if inspected is not None:
        plain, keys = inspected
        assert plain == _plain(value)
        assert keys == {k for k in SCAN_KEYS if _mentions(value, k)}
