"""Validation over many schema shapes and dialects, through the compiled validators bastion uses."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.validation import SchemaLimits, compile_tool

LIMITS = SchemaLimits()


def violations(schema: dict[str, Any], instance: Any) -> tuple[str, ...]:
    return compile_tool({"inputSchema": schema}, LIMITS).input.validate(instance).violations


@pytest.mark.parametrize(("schema", "instance", "expected"), [
    ({"type": "string"}, 3, ("$: must be of type string",)),
    ({"type": ["string", "null"]}, 3, ("$: must be one of types: string, null",)),
    ({"type": "integer"}, 1.5, ("$: must be of type integer",)),
    ({"minimum": 2}, 1, ("$: must be >= 2",)),
    ({"exclusiveMaximum": 5}, 5, ("$: must be < 5",)),
    ({"multipleOf": 3}, 4, ("$: must be a multiple of 3",)),
    ({"minLength": 3}, "ab", ("$: must be at least 3 characters long",)),
    ({"maxLength": 1}, "ab", ("$: must be at most 1 character long",)),
    ({"minItems": 2}, [1], ("$: must have at least 2 items",)),
    ({"uniqueItems": True}, [1, 1], ("$: must not contain duplicate items",)),
    ({"maxProperties": 1}, {"a": 1, "b": 2}, ("$: must have at most 1 property",)),
    ({"const": "x"}, "y", ("$: must be equal to the allowed constant",)),
    ({"contains": {"type": "string"}}, [1], ("$: must contain at least 1 matching item",)),
    ({"dependentRequired": {"a": ["b"]}}, {"a": 1}, ("$: property 'a' requires property 'b'",)),
    ({"propertyNames": {"maxLength": 2}}, {"abc": 1}, ("$: has a property name that is not allowed",)),
    (False, 1, ("$: is not allowed",)),
])
def test_keyword_messages(schema: Any, instance: Any, expected: tuple[str, ...]) -> None:
    if schema is False:
        schema = {"properties": {"x": False}}
        instance = {"x": instance}
        expected = ("$.x: is not allowed",)
    assert violations(schema, instance) == expected


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("date-time", "2025-01-31T12:00:00Z", "2025-13-31T12:00:00Z"),
    ("date", "2024-02-29", "2023-02-29"),
    ("time", "23:59:60+01:00", "24:00:00Z"),
    ("email", "a@example.org", "nobody"),
    ("ipv4", "192.0.2.1", "256.0.0.1"),
    ("ipv6", "2001:db8::1", "2001:db8:::1"),
    ("uuid", "12345678-1234-5678-1234-567812345678", "12345678123456781234567812345678"),
    ("hostname", "api.example.org", "-bad-.example"),
    ("uri", "https://example.org/x", "not a uri"),
    ("regex", "^a+$", "(a)\\1"),
    ("json-pointer", "/a/~0b", "a/b"),
])
def test_formats_are_asserted(fmt: str, good: str, bad: str) -> None:
    schema = {"type": "string", "format": fmt}
    assert violations(schema, good) == ()
    assert violations(schema, bad) == (f"$: must be a valid {fmt}",)


def test_unknown_format_passes_and_non_strings_are_left_to_type() -> None:
    assert violations({"format": "made-up"}, "anything") == ()
    assert violations({"format": "email"}, 42) == ()


def test_local_refs_and_defs() -> None:
    schema = {
        "type": "object",
        "$defs": {"count": {"type": "integer", "maximum": 10}, "named": {"$anchor": "nm", "type": "string"}},
        "properties": {"count": {"$ref": "#/$defs/count"}, "name": {"$ref": "#nm"}},
    }
    assert violations(schema, {"count": 3, "name": "x"}) == ()
    assert violations(schema, {"count": 11, "name": 1}) == ("$.count: must be <= 10", "$.name: must be of type string")


def test_recursive_local_ref_validates_trees() -> None:
    schema = {"$defs": {"node": {"type": "object", "properties": {"children": {"type": "array",
              "items": {"$ref": "#/$defs/node"}}, "v": {"type": "integer"}}}}, "$ref": "#/$defs/node"}
    tree = {"v": 1, "children": [{"v": 2, "children": [{"v": "x"}]}]}
    assert violations(schema, tree) == ("$.children[0].children[0].v: must be of type integer",)


def test_ref_to_embedded_id_resource() -> None:
    schema = {"$id": "https://tools.example/root", "$defs": {"p": {"$id": "point", "type": "object",
              "required": ["x"]}}, "properties": {"at": {"$ref": "point"}}}
    assert violations(schema, {"at": {}}) == ("$.at: missing required property 'x'",)


def test_additional_properties() -> None:
    closed = {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x-": {"type": "string"}},
              "additionalProperties": False}
    assert violations(closed, {"a": 1, "x-y": "ok"}) == ()
    assert violations(closed, {"a": 1, "x-y": 2, "b": 1, "c": 2}) == (
        "$: unexpected property 'b'", "$: unexpected property 'c'", "$['x-y']: must be of type string")
    typed = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert violations(typed, {"n": "1"}) == ("$.n: must be of type integer",)


@pytest.mark.parametrize(("schema", "good", "bad", "expected"), [
    ({"allOf": [{"type": "integer"}, {"minimum": 5}]}, 6, 4, ("$: must be >= 5",)),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "a", None,
     ("$: must match at least one of the allowed schemas",)),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1.5, 1,
     ("$: must match exactly one of the allowed schemas",)),
    ({"not": {"type": "null"}}, 0, None, ("$: must not match the disallowed schema",)),
    ({"if": {"properties": {"kind": {"const": "file"}}}, "then": {"required": ["path"]}},
     {"kind": "dir"}, {"kind": "file"}, ("$: missing required property 'path'",)),
])
def test_composition(schema: dict[str, Any], good: Any, bad: Any, expected: tuple[str, ...]) -> None:
    assert violations(schema, good) == ()
    assert violations(schema, bad) == expected


def test_2020_12_prefix_items_and_items_false() -> None:
    schema = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}
    assert violations(schema, ["a", 1]) == ()
    assert violations(schema, [1, 1, 3]) == ("$: must have at most 2 items", "$[0]: must be of type string")


def test_draft_07_items_array_form_and_additional_items() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
              "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": False}
    assert violations(schema, ["a", 1]) == ()
    assert violations(schema, ["a", "b", 3]) == ("$: must have at most 2 items", "$[1]: must be of type integer")


def test_items_array_form_is_invalid_under_default_2020_12() -> None:
    from bastion.validation import SchemaRejected
    with pytest.raises(SchemaRejected, match="not a valid 2020-12 schema"):
        compile_tool({"inputSchema": {"items": [{"type": "string"}]}}, LIMITS)


def test_draft_04_boolean_exclusive_maximum() -> None:
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "maximum": 10, "exclusiveMaximum": True}
    assert violations(schema, 10) == ("$: must be < 10",)


def test_draft_2019_09_is_honoured() -> None:
    schema = {"$schema": "https://json-schema.org/draft/2019-09/schema", "type": "object",
              "properties": {"a": {}}, "unevaluatedProperties": False}
    assert violations(schema, {"a": 1, "b": 2}) == ("$: has unevaluated properties that are not allowed",)


def test_paths_render_odd_names_quoted() -> None:
    schema = {"type": "object", "properties": {"a b": {"type": "object", "properties": {"c": {"type": "array",
              "items": {"type": "integer"}}}}}}
    assert violations(schema, {"a b": {"c": [1, "x"]}}) == ("$['a b'].c[1]: must be of type integer",)


def test_order_is_deterministic_and_numeric_for_indexes() -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    instance = ["x"] * 12
    first = violations(schema, instance)
    assert first == violations(schema, list(instance))
    assert first[:3] == ("$[0]: must be of type integer", "$[1]: must be of type integer",
                         "$[2]: must be of type integer")
