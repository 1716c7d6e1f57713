"""Turn jsonschema errors into short violations a model can act on: ``$.count: must be <= 10``.

Pure code. A violation names where (a JSON path) and what the schema wants; it never repeats the offending value,
which may be a secret. Property names are shown (the model needs them to fix the call), shortened when long.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError

from bastion.validation.engine import additional_keys
from bastion.validation.regex import describe

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FORMAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
_MAX_NAME_CHARS = 40


@dataclass(frozen=True, slots=True)
class Report:
    """At most ``max_errors`` violations in a stable order; ``truncated`` when more were found."""

    violations: tuple[str, ...]
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations


def build_report(errors: Iterable[ValidationError], max_errors: int) -> Report:
    """Render, de-duplicate and sort ``errors`` (which the caller has already bounded in number)."""
    keyed: dict[str, tuple[tuple[tuple[int, int | str], ...], str]] = {}
    for error in errors:
        path = tuple(error.absolute_path)
        prefix = json_path(path)
        for reason in reasons(error):
            text = f"{prefix}: {reason}"
            keyed.setdefault(text, (_sort_key(path), text))
    ordered = [text for _, text in sorted(keyed.values())]
    return Report(tuple(ordered[:max_errors]), truncated=len(ordered) > max_errors)


def single(reason: str) -> Report:
    """A report of one violation about the whole value (size, depth, budget)."""
    return Report((f"$: {reason}",))


def json_path(path: Sequence[int | str]) -> str:
    parts = ["$"]
    for item in path:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif _IDENTIFIER.fullmatch(item) and len(item) <= _MAX_NAME_CHARS:
            parts.append(f".{item}")
        else:
            parts.append(f"[{_name(item)}]")
    return "".join(parts)


def _sort_key(path: Sequence[int | str]) -> tuple[tuple[int, int | str], ...]:
    # Indexes sort numerically and before names, so $[2] < $[10] and the order never depends on types mixing.
    return tuple((0, item) if isinstance(item, int) else (1, item) for item in path)


def _name(name: str) -> str:
    shown = name if len(name) <= _MAX_NAME_CHARS else name[:_MAX_NAME_CHARS] + "..."
    # JSON escaping neutralises control characters; the quotes are single, as in the messages' examples.
    escaped = json.dumps(shown, ensure_ascii=False)[1:-1].replace('\\"', '"').replace("'", "\\'")
    return f"'{escaped}'"


def _num(value: Any) -> str:
    return str(value) if isinstance(value, int) else repr(value)


def _plural(count: Any, word: str) -> str:
    return f"{_num(count)} {word}" + ("" if count == 1 else "s")


_TYPE_NAMES = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean",
               "object": "object", "array": "array", "null": "null"}


def reasons(error: ValidationError) -> list[str]:
    """The violation(s) one error stands for, without the instance's value."""
    if "propertyNames" in error.relative_schema_path:
        return ["has a property name that is not allowed"]
    keyword: Any = error.validator
    value: Any = error.validator_value
    instance: Any = error.instance
    schema: Any = error.schema if isinstance(error.schema, Mapping) else {}
    if keyword is None:
        return ["is not allowed"]
    simple = _simple(str(keyword), value, schema)
    if simple is not None:
        return [simple]
    if keyword == "required" and isinstance(instance, Mapping) and isinstance(value, list):
        return [f"missing required property {_name(str(name))}" for name in value if name not in instance]
    if keyword == "additionalProperties" and isinstance(instance, Mapping):
        return [f"unexpected property {_name(key)}" for key in additional_keys(instance, schema)] or \
            ["has properties that are not allowed"]
    if keyword in ("dependentRequired", "dependencies") and isinstance(instance, Mapping) \
            and isinstance(value, Mapping):
        return [f"property {_name(prop)} requires property {_name(str(dep))}"
                for prop, deps in value.items() if prop in instance and isinstance(deps, list)
                for dep in deps if dep not in instance] or ["does not satisfy its dependencies"]
    return [f"does not satisfy {_name(str(keyword))}"]


def _simple(keyword: str, value: Any, schema: Mapping[str, Any]) -> str | None:
    if keyword == "type":
        names = [value] if isinstance(value, str) else list(value)
        shown = [_TYPE_NAMES.get(str(n), _name(str(n))) for n in names]
        return f"must be of type {shown[0]}" if len(shown) == 1 else f"must be one of types: {', '.join(shown)}"
    if keyword in ("minimum", "maximum"):
        # draft-04 spells exclusive bounds as a boolean next to minimum/maximum.
        exclusive = schema.get("exclusiveMinimum" if keyword == "minimum" else "exclusiveMaximum") is True
        op = (">" if exclusive else ">=") if keyword == "minimum" else ("<" if exclusive else "<=")
        return f"must be {op} {_num(value)}"
    templates = {
        "exclusiveMinimum": "must be > {n}",
        "exclusiveMaximum": "must be < {n}",
        "multipleOf": "must be a multiple of {n}",
        "minLength": "must be at least {chars} long",
        "maxLength": "must be at most {chars} long",
        "minItems": "must have at least {items}",
        "maxItems": "must have at most {items}",
        "minProperties": "must have at least {props}",
        "maxProperties": "must have at most {props}",
    }
    if keyword in templates:
        return templates[keyword].format(n=_num(value), chars=_plural(value, "character"),
                                         items=_plural(value, "item"), props=_plural(value, "property")
                                         .replace("propertys", "properties"))
    fixed = {
        "enum": "must be one of the allowed values",
        "const": "must be equal to the allowed constant",
        "uniqueItems": "must not contain duplicate items",
        "anyOf": "must match at least one of the allowed schemas",
        "oneOf": "must match exactly one of the allowed schemas",
        "not": "must not match the disallowed schema",
        "unevaluatedProperties": "has unevaluated properties that are not allowed",
        "unevaluatedItems": "has unevaluated items that are not allowed",
    }
    if keyword in fixed:
        return fixed[keyword]
    if keyword == "pattern":
        return f"must match the pattern {describe(str(value))}"
    if keyword == "format":
        name = str(value)
        return f"must be a valid {name if _FORMAT_NAME.fullmatch(name) else _name(name)}"
    if keyword in ("items", "additionalItems"):
        prefix = schema.get("prefixItems" if keyword == "items" else "items", [])
        return f"must have at most {_plural(len(prefix) if isinstance(prefix, list) else 0, 'item')}"
    if keyword in ("contains", "minContains", "maxContains"):
        if keyword == "maxContains":
            return f"must contain at most {_plural(value, 'matching item')}"
        least = schema.get("minContains", 1)
        return f"must contain at least {_plural(least, 'matching item')}"
    return None
