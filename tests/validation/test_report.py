"""Violation reports: concise, ordered, bounded, and never echoing the offending value."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.validation import SchemaLimits, compile_tool
from bastion.validation.report import json_path

SECRET = "sk-live-9f8e7d6c5b4a39281706f5e4d3c2b1a0"

SCHEMA = {
    "type": "object",
    "required": ["path"],
    "additionalProperties": False,
    "properties": {
        "path": {"type": "string"},
        "token": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$", "format": "uuid"},
        "count": {"type": "integer", "maximum": 10},
        "mode": {"enum": ["read", "write"]},
        "flag": {"const": True},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "alt": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
        "not_secret": {"not": {"type": "string"}},
    },
}


@pytest.mark.parametrize("field", ["token", "count", "mode", "flag", "tags", "alt", "not_secret", "path"])
def test_secret_value_is_never_echoed(field: str) -> None:
    validators = compile_tool({"inputSchema": SCHEMA}, SchemaLimits())
    value: Any = [SECRET, SECRET] if field == "tags" else SECRET
    if field == "path":
        value = {"nested": SECRET}
    report = validators.input.validate({"path": "p", field: value})
    assert report.violations
    assert all(SECRET not in violation and "9f8e7d" not in violation for violation in report.violations)


def test_brief_examples() -> None:
    validators = compile_tool({"inputSchema": SCHEMA}, SchemaLimits())
    assert validators.input.validate({"count": 11, "mode": "delete"}).violations == (
        "$: missing required property 'path'",
        "$.count: must be <= 10",
        "$.mode: must be one of the allowed values",
    )


def test_at_most_max_errors_and_truncation_flag() -> None:
    validators = compile_tool({"inputSchema": {"type": "array", "items": {"type": "integer"}}},
                              SchemaLimits(max_errors=3))
    report = validators.input.validate(["x"] * 50)
    assert report.violations == ("$[0]: must be of type integer", "$[1]: must be of type integer",
                                 "$[2]: must be of type integer")
    assert report.truncated
    exact = validators.input.validate(["x"] * 3)
    assert len(exact.violations) == 3
    assert not exact.truncated


def test_duplicate_violations_are_collapsed() -> None:
    schema = {"allOf": [{"required": ["a"]}, {"required": ["a"]}]}
    assert compile_tool({"inputSchema": schema}, SchemaLimits()).input.validate({}).violations == (
        "$: missing required property 'a'",)


@pytest.mark.parametrize(("path", "expected"), [
    ((), "$"),
    (("a", "b", 0), "$.a.b[0]"),
    (("with space", 3, "_ok1"), "$['with space'][3]._ok1"),
    (("quo'te\n",), "$['quo\\'te\\n']"),
    (("x" * 50,), "$['" + "x" * 40 + "...']"),
])
def test_json_path(path: tuple[int | str, ...], expected: str) -> None:
    assert json_path(path) == expected
