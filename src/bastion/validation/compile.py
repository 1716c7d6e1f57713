"""Compile a tool's schemas once into immutable validators, or reject the tool.

A schema that is unsafe or unusable (unsupported dialect, fails its metaschema, non-local ``$ref``, over the size
or depth limits, a pattern RE2 cannot run) raises ``SchemaRejected``: the tool is quarantined, never validated
permissively.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.exceptions import _Error as JsonSchemaError
from referencing.exceptions import Unresolvable

from bastion.errors import BastionError
from bastion.validation.engine import (
    CURRENT_RUN,
    DEFAULT_DIALECT,
    DIALECTS,
    FORMAT_CHECKER,
    REFUSING_REGISTRY,
    ROOTED_REGISTRY,
    BudgetExhausted,
    Dialect,
    Run,
    dialect_key,
)
from bastion.validation.fast import LazyCheck
from bastion.validation.limits import _FLOAT_BYTES, _NULL_BYTES, Excess, SchemaLimits, _string_bytes, measure
from bastion.validation.regex import UnsupportedPattern
from bastion.validation.report import Report, build_report, json_path, single
from bastion.validation.scan import SCAN_KEYS, UnsafeSchema, scan

Role = Literal["inputSchema", "outputSchema"]

_TOO_COMPLEX = "is too complex to validate within bastion's limits"
_UNEVALUABLE = "cannot be checked: the schema could not be evaluated"
_VALID = Report(())


class SchemaRejected(BastionError):
    """A tool's schema cannot be used safely; the tool must be quarantined. ``reason`` is for operators' logs."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CompiledSchema:
    """One compiled schema and the bounds that apply to values checked against it. Reusable across calls."""

    role: Role
    dialect: str
    _validator: Any = field(repr=False)
    _patterns: Mapping[str, Any] = field(repr=False)
    _max_bytes: int
    _max_depth: int
    _max_errors: int
    _max_steps: int
    # The fast path (``fast.py``) for a schema in its subset: proves a passing value valid without jsonschema.
    # Compiled on first use (``LazyCheck``), so building a large catalogue does not pay for it.
    _fast: LazyCheck | None = field(default=None, repr=False)

    def validate(self, instance: Any) -> Report:
        """Check ``instance``; the report is empty when it is valid. Never raises for a bad instance."""
        excess = measure(instance, max_bytes=self._max_bytes, max_depth=self._max_depth)
        if excess is not None:
            return single(_excess_reason("value", excess))
        fast = self._fast.get() if self._fast is not None else None
        if fast is not None and 0 <= fast(instance) <= self._max_steps:
            return _VALID
        token = CURRENT_RUN.set(Run(self._patterns, self._max_steps))
        try:
            # Twice the cap plus one: room for de-duplication, and proof that more exist.
            errors = list(itertools.islice(self._validator.iter_errors(instance), 2 * self._max_errors + 1))
            return build_report(errors, self._max_errors)
        except (BudgetExhausted, RecursionError):
            return single(_TOO_COMPLEX)
        except (Unresolvable, UnsupportedPattern, JsonSchemaError):
            return single(_UNEVALUABLE)
        finally:
            CURRENT_RUN.reset(token)


@dataclass(frozen=True, slots=True)
class ToolValidators:
    """A tool's compiled input validator, and output validator when it declares ``outputSchema``."""

    input: CompiledSchema
    output: CompiledSchema | None


def compile_tool(definition: Mapping[str, Any], limits: SchemaLimits) -> ToolValidators:
    """Compile the ``inputSchema`` and ``outputSchema`` of a tool definition; raise ``SchemaRejected``."""
    input_schema = definition.get("inputSchema")
    if not isinstance(input_schema, Mapping):
        raise SchemaRejected("inputSchema is missing or not an object")
    compiled_input = compile_schema(input_schema, limits, "inputSchema")
    output_schema = definition.get("outputSchema")
    if output_schema is None:
        return ToolValidators(compiled_input, None)
    if not isinstance(output_schema, Mapping):
        raise SchemaRejected("outputSchema is not an object")
    return ToolValidators(compiled_input, compile_schema(output_schema, limits, "outputSchema"))


def compile_schema(schema: Mapping[str, Any], limits: SchemaLimits, role: Role) -> CompiledSchema:
    # Size first: every later step costs time proportional to the schema. The private copy is made by the same
    # walk, which stops at the first bound crossed; ``measure`` then says which bound, exactly as it always did.
    inspected = _inspect(schema, limits.max_schema_bytes, limits.max_schema_depth)
    keys: set[str] | None = None
    if inspected is None:
        excess = measure(schema, max_bytes=limits.max_schema_bytes, max_depth=limits.max_schema_depth)
        if excess is not None:
            raise SchemaRejected(f"{role} {_excess_reason('schema', excess)}")
        plain = _plain(schema)
    else:
        plain, keys = inspected
    dialect = _dialect(plain, role)
    try:
        # format_checker=None: the metaschema's "regex" format would compile patterns with Python's re; the scan
        # compiles them with RE2 instead. The compiled metaschema answers "valid" in a fraction of the time;
        # jsonschema still decides (and words the reason for) everything it does not pass.
        if dialect.valid_schema is None or not dialect.valid_schema(plain):
            dialect.validator_class.check_schema(plain, format_checker=None)
    except SchemaError as exc:
        where = json_path(list(exc.absolute_path))
        raise SchemaRejected(f"{role} is not a valid {dialect.name} schema: at {where}, fails "
                             f"{exc.validator!r}") from exc
    try:
        scanned = scan(plain, dialect, keys=keys)
    except UnsafeSchema as exc:
        raise SchemaRejected(f"{role}: {exc}") from exc
    except (Unresolvable, RecursionError) as exc:
        raise SchemaRejected(f"{role}: references cannot be resolved") from exc
    # The resolver jsonschema would build itself, from the registry it would combine itself: combining the
    # metaschema registry per schema was a third of the cost of constructing a validator.
    resolver = ROOTED_REGISTRY.resolver_with_root(dialect.specification.create_resource(plain))
    validator = dialect.validator_class(plain, registry=REFUSING_REGISTRY, format_checker=FORMAT_CHECKER,
                                        _resolver=resolver)
    if role == "outputSchema":
        max_bytes, max_depth = limits.max_output_bytes, limits.max_output_depth
    else:
        max_bytes, max_depth = limits.max_argument_bytes, limits.max_argument_depth
    return CompiledSchema(role=role, dialect=dialect.name, _validator=validator,
                          _patterns=MappingProxyType(dict(scanned.patterns)), _max_bytes=max_bytes,
                          _max_depth=max_depth, _max_errors=limits.max_errors,
                          _max_steps=limits.max_validation_steps,
                          _fast=LazyCheck(plain, dialect, scanned.patterns))


def _dialect(schema: Mapping[str, Any], role: Role) -> Dialect:
    declared = schema.get("$schema")
    if declared is None:
        return DEFAULT_DIALECT
    if not isinstance(declared, str):
        raise SchemaRejected(f"{role} has a $schema that is not a string")
    dialect = DIALECTS.get(dialect_key(declared))
    if dialect is None:
        shown = declared if len(declared) <= 80 else declared[:80] + "..."
        raise SchemaRejected(f"{role} declares an unsupported dialect {shown!r} (supported: 2020-12, 2019-09, "
                             "draft-07, draft-06, draft-04)")
    return dialect


def _plain(value: Any) -> Any:
    """A private deep copy in plain dicts and lists: the validator must not see later changes, and jsonschema
    recognises JSON objects and arrays by ``dict`` and ``list``."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value  # the common leaves, without the ABC check below
    if kind is dict or isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


class _Crossed(Exception):
    """A bound was crossed during ``_inspect``."""


def _inspect(schema: Mapping[str, Any], max_bytes: int, max_depth: int) -> tuple[Any, set[str]] | None:
    """``_plain(schema)`` and which of ``scan.SCAN_KEYS`` appear in it, in one walk that sizes it as
    ``limits.json_size`` does; None as soon as the size or the depth crosses its bound."""
    size = 0
    keys: set[str] = set()

    def copy(value: Any, depth: int) -> Any:
        nonlocal size
        kind = type(value)
        if kind is str:
            size += len(value) + 2 if value.isascii() else _string_bytes(value)
        elif kind is dict or isinstance(value, Mapping):
            depth += 1
            size += 2 + len(value)
            if depth > max_depth or size > max_bytes:
                raise _Crossed
            if not SCAN_KEYS.isdisjoint(value):
                keys.update(SCAN_KEYS.intersection(value))
            out = {}
            for key, item in value.items():
                size += _string_bytes(key) + 1 if isinstance(key, str) else _FLOAT_BYTES
                out[key] = copy(item, depth)
            return out
        elif isinstance(value, list | tuple):
            depth += 1
            size += 2 + len(value)
            if depth > max_depth or size > max_bytes:
                raise _Crossed
            return [copy(item, depth) for item in value]
        elif isinstance(value, str):
            size += _string_bytes(value)
        elif isinstance(value, bool) or value is None:
            size += _NULL_BYTES
        elif isinstance(value, int):
            size += value.bit_length() // 3 + 2
        else:
            size += _FLOAT_BYTES
        if size > max_bytes:
            raise _Crossed
        return value

    try:
        plain = copy(schema, 0)
    except (_Crossed, RecursionError):
        return None
    return plain, keys


def _excess_reason(what: str, excess: Excess) -> str:
    if excess.kind == "bytes":
        return f"is larger than the limit of {excess.limit} bytes"
    return f"is nested deeper than the limit of {excess.limit} levels"


__all__ = ["CompiledSchema", "SchemaRejected", "ToolValidators", "ValidationError", "compile_schema", "compile_tool"]
