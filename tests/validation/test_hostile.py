"""Hostile schemas: quarantined at compile time, or bounded at validation time. Never fetched, never slow."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bastion.errors import BastionError
from bastion.validation import SchemaLimits, SchemaRejected, compile_tool

LIMITS = SchemaLimits()


def rejected(schema: Any, limits: SchemaLimits = LIMITS, key: str = "inputSchema") -> str:
    definition: dict[str, Any] = {"inputSchema": {"type": "object"}}
    definition[key] = schema
    with pytest.raises(SchemaRejected) as info:
        compile_tool(definition, limits)
    assert isinstance(info.value, BastionError)
    return info.value.reason


class _Counting(BaseHTTPRequestHandler):
    hits: list[str]

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    """A real loopback server that would happily serve a schema, and counts every request it receives."""
    hits: list[str] = []
    handler = type("Handler", (_Counting,), {"hits": hits})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def test_remote_ref_is_rejected_and_never_fetched(schema_server: tuple[str, list[str]]) -> None:
    base, hits = schema_server
    reason = rejected({"type": "object", "properties": {"a": {"$ref": f"{base}/s.json"}}})
    assert "is not local to the schema" in reason
    assert hits == []


def test_remote_ref_via_relative_uri_against_remote_id_is_never_fetched(schema_server: tuple[str, list[str]]) -> None:
    base, hits = schema_server
    reason = rejected({"$id": f"{base}/root.json", "properties": {"a": {"$ref": "other.json"}}})
    assert "'other.json' is not local" in reason
    assert hits == []


def test_file_ref_is_rejected_and_never_read(tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    target.write_text('{"type": "string"}')
    reason = rejected({"properties": {"a": {"$ref": target.as_uri()}}})
    assert "is not local to the schema" in reason


def test_metaschema_ref_is_not_local_either() -> None:
    assert "not local" in rejected({"$ref": "https://json-schema.org/draft/2020-12/schema"})


def test_dangling_local_ref_is_rejected() -> None:
    assert "points to nothing" in rejected({"$ref": "#/$defs/missing"})


def test_remote_ref_in_output_schema_is_rejected(schema_server: tuple[str, list[str]]) -> None:
    base, hits = schema_server
    reason = rejected({"$ref": f"{base}/out.json"}, key="outputSchema")
    assert reason.startswith("outputSchema: $ref")
    assert hits == []


@pytest.mark.parametrize("uri", ["http://json-schema.org/draft-03/schema#", "https://example.org/my-dialect"])
def test_unsupported_dialect_is_rejected(uri: str) -> None:
    assert "unsupported dialect" in rejected({"$schema": uri, "type": "object"})


@pytest.mark.parametrize("uri", ["http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft-07/schema",
                                 "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-06/schema#",
                                 "https://json-schema.org/draft/2019-09/schema",
                                 "https://json-schema.org/draft/2020-12/schema"])
def test_supported_dialects_are_honoured(uri: str) -> None:
    validators = compile_tool({"inputSchema": {"$schema": uri, "type": "object"}}, LIMITS)
    assert validators.input.validate({}).ok


@pytest.mark.parametrize("schema", [{"type": "nope"}, {"properties": []}, {"required": "x"}, {"$schema": 7}])
def test_invalid_schema_is_rejected(schema: dict[str, Any]) -> None:
    reason = rejected(schema)
    assert "not a valid 2020-12 schema" in reason or "$schema that is not a string" in reason


def test_missing_or_non_object_schemas_are_rejected() -> None:
    with pytest.raises(SchemaRejected, match="inputSchema is missing"):
        compile_tool({"name": "x"}, LIMITS)
    assert rejected([1], key="outputSchema") == "outputSchema is not an object"


def test_schema_size_and_depth_limits() -> None:
    small = SchemaLimits(max_schema_bytes=200, max_schema_depth=4)
    big = {"type": "object", "description": "x" * 300}
    assert rejected(big, small) == "inputSchema is larger than the limit of 200 bytes"
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(3):
        deep = {"type": "object", "properties": {"a": deep}}
    assert rejected(deep, small) == "inputSchema is nested deeper than the limit of 4 levels"


def test_unsupported_regex_quarantines() -> None:
    assert "backreferences and lookaround" in rejected({"properties": {"a": {"pattern": "(a)\\1"}}})
    assert "backreferences and lookaround" in rejected({"patternProperties": {"(?=x)": {}}})


def test_catastrophic_pattern_finishes_on_a_long_input() -> None:
    validators = compile_tool({"inputSchema": {"type": "object", "properties": {"s": {"pattern": "^(a+)+$"}},
                                               "patternProperties": {"^(a|a)+$": {"type": "integer"}}}}, LIMITS)
    hostile = "a" * 50_000 + "!"
    report = validators.input.validate({"s": hostile, hostile: "x"})
    assert report.violations == ("$.s: must match the pattern '^(a+)+$'",)
    assert validators.input.validate({"s": "aaaa", "aaa": 1}).ok


def test_catastrophic_pattern_in_additional_properties_names_finishes() -> None:
    # jsonschema's own additionalProperties runs patternProperties keys through Python's re.
    schema = {"type": "object", "patternProperties": {"^(a+)+$": {}}, "additionalProperties": False}
    validators = compile_tool({"inputSchema": schema}, LIMITS)
    name = "a" * 40 + "!"
    shown = "a" * 40 + "..."
    assert validators.input.validate({name: 1}).violations == (f"$: unexpected property '{shown}'",)


def test_a_lone_surrogate_is_matched_not_an_error() -> None:
    """JSON strings may hold lone surrogates (the front door keeps them); RE2 matches UTF-8, which cannot hold
    them. Patterns still decide, reading each as U+FFFD, in values and in property names alike."""
    schema = {"type": "object", "properties": {"s": {"pattern": "^[a-z]+$"}, "any": {"pattern": "^a.$"}},
              "patternProperties": {"^k[a-z]$": {"type": "integer"}}, "additionalProperties": False}
    validators = compile_tool({"inputSchema": schema}, LIMITS)
    assert validators.input.validate({"s": "a\ud800"}).violations == ("$.s: must match the pattern '^[a-z]+$'",)
    assert validators.input.validate({"any": "a\udfff"}).ok
    assert not validators.input.validate({"k\ud800": 1}).ok  # not a k+letter name: an unexpected property
    assert validators.input.validate({"kx": 1, "s": "ok"}).ok


def test_unevaluated_properties_with_pattern_properties_is_rejected() -> None:
    reason = rejected({"patternProperties": {"^a": {}}, "unevaluatedProperties": False})
    assert "unevaluatedProperties combined with patternProperties" in reason


def test_exponential_composition_is_cut_by_the_step_budget() -> None:
    defs: dict[str, Any] = {"l30": {"type": "string"}}
    for level in range(29, -1, -1):
        nxt = f"#/$defs/l{level + 1}"
        defs[f"l{level}"] = {"anyOf": [{"$ref": nxt}, {"$ref": nxt}]}
    validators = compile_tool({"inputSchema": {"$defs": defs, "$ref": "#/$defs/l0"}}, LIMITS)
    assert validators.input.validate(1).violations == ("$: is too complex to validate within bastion's limits",)
    assert validators.input.validate("fine").ok


def test_self_referencing_schema_is_bounded() -> None:
    validators = compile_tool({"inputSchema": {"$ref": "#"}}, LIMITS)
    assert validators.input.validate({}).violations == ("$: is too complex to validate within bastion's limits",)


def test_argument_size_and_depth_are_checked_before_validation() -> None:
    limits = SchemaLimits(max_argument_bytes=100, max_argument_depth=3)
    validators = compile_tool({"inputSchema": {"type": "object"}}, limits)
    assert validators.input.validate({"a": "x" * 200}).violations == (
        "$: is larger than the limit of 100 bytes",)
    assert validators.input.validate({"a": {"b": {"c": {}}}}).violations == (
        "$: is nested deeper than the limit of 3 levels",)
    assert validators.input.validate({"a": {"b": {}}}).ok


def test_extremely_deep_argument_does_not_exhaust_the_stack() -> None:
    value: Any = 1
    for _ in range(100_000):
        value = [value]
    validators = compile_tool({"inputSchema": {"type": "object"}}, LIMITS)
    assert validators.input.validate(value).violations == ("$: is nested deeper than the limit of 64 levels",)


def test_compiled_validators_ignore_later_changes_to_the_definition() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    validators = compile_tool({"inputSchema": schema}, LIMITS)
    schema["properties"]["n"]["type"] = "string"
    assert validators.input.validate({"n": 1}).ok


def test_unique_items_is_linear_and_keeps_json_equality() -> None:
    validators = compile_tool({"inputSchema": {"type": "array", "uniqueItems": True}}, LIMITS)
    distinct = [{"n": i, "tags": [i, "x"]} for i in range(20_000)]
    assert validators.input.validate(distinct).ok
    assert validators.input.validate([*distinct, {"tags": [5, "x"], "n": 5}]).violations == (
        "$: must not contain duplicate items",)
    assert not validators.input.validate([1, 1.0]).ok
    assert validators.input.validate([1, True]).ok
    assert validators.input.validate([0, False, None, "0", [0], {"0": 0}]).ok


DRAFT7 = "http://json-schema.org/draft-07/schema#"


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"child": value}
    return value


@pytest.mark.parametrize(("schema", "costly"), [
    # The root's own $schema, entered again through a recursive $ref (the TypeScript SDK writes this $schema).
    ({"$schema": DRAFT7, "type": "object",
      "properties": {"child": {"$ref": "#"}, "name": {"type": "string", "pattern": "^(a+)+$"}}}, _nested(40)),
    # A $schema below the root.
    ({"type": "object", "properties": {"child": {"$schema": "https://json-schema.org/draft/2020-12/schema",
                                                 "properties": {"name": {"pattern": "^(a+)+$"}},
                                                 "additionalProperties": {"type": "string"}}}},
     {"child": {f"k{i}": "x" for i in range(40)}}),
])
def test_a_subschemas_dollar_schema_does_not_escape_re2_or_the_budget(schema: dict[str, Any], costly: Any) -> None:
    # jsonschema would validate such subschemas with its stock validator: Python's re (this input would take
    # minutes), and no step budget.
    validator = compile_tool({"inputSchema": schema}, LIMITS).input
    assert validator.validate({"child": {"name": "a" * 50_000 + "!"}}).violations == (
        "$.child.name: must match the pattern '^(a+)+$'",)
    tight = compile_tool({"inputSchema": schema}, dataclasses.replace(LIMITS, max_validation_steps=30)).input
    assert tight.validate(costly).violations == ("$: is too complex to validate within bastion's limits",)
