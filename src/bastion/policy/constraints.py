"""Argument constraints: predicates over one value inside a call's arguments.

A predicate answers in three values: True (the value is in the described set), False (it is not), None (bastion
cannot tell: a pattern over a number, a path with a NUL byte or a ``..`` that climbs above the root, a relative
path against an absolute prefix). An allow rule needs True; a deny rule matches on True *or* None, so a value
crafted to confuse the checker is refused rather than waved through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import re2

from bastion.errors import ConfigError

JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")
_ABSENT = object()


@dataclass(frozen=True, slots=True)
class ArgConstraint:
    """Constraints on the argument at ``path`` (object keys, outermost first). All given checks must hold."""

    path: tuple[str, ...]
    type: str | None = None
    enum: tuple[Any, ...] | None = None
    pattern: str | None = None
    path_prefix: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    max_length: int | None = None
    optional: bool = False
    regex: Any = None  # compiled re2 pattern

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @classmethod
    def from_mapping(cls, arg_path: str, data: Mapping[str, Any], path: str) -> ArgConstraint:
        """Build from a schema-validated mapping; semantic errors raise ConfigError at ``path``."""
        segments = tuple(arg_path.split("."))
        if not all(segments):
            raise ConfigError(f"invalid argument path {arg_path!r}: use dotted object keys like 'options.depth'",
                              path=path)
        regex = None
        if "pattern" in data:
            try:
                regex = re2.compile(data["pattern"], _quiet_options())
            except re2.error as exc:
                raise ConfigError(f"invalid pattern {data['pattern']!r}: {_re2_message(exc)} (patterns use RE2 "
                                  "syntax: no backreferences or lookaround)", path=f"{path}.pattern") from None
        prefix = None
        if "path_prefix" in data:
            text = data["path_prefix"]
            prefix = normalize_path(text)
            if not text.startswith("/") or prefix is None or ".." in text.split("/"):
                raise ConfigError(f"invalid path_prefix {text!r}: must be an absolute path without '..' or NUL",
                                  path=f"{path}.path_prefix")
        low, high = data.get("min"), data.get("max")
        if low is not None and high is not None and low > high:
            raise ConfigError(f"min ({low}) is greater than max ({high}): no value could match", path=path)
        return cls(path=segments, type=data.get("type"),
                   enum=tuple(data["enum"]) if "enum" in data else None,
                   pattern=data.get("pattern"), path_prefix=prefix, min=low, max=high,
                   max_length=data.get("max_length"), optional=bool(data.get("optional", False)), regex=regex)

    def evaluate(self, arguments: Mapping[str, Any]) -> bool | None:
        value = _lookup(arguments, self.path)
        if value is _ABSENT:
            return self.optional
        return all3(check(value) for check in self._checks())

    def _checks(self) -> list[Any]:
        checks: list[Any] = []
        if self.type is not None:
            checks.append(lambda v: json_type_matches(v, self.type))
        if self.enum is not None:
            checks.append(lambda v: any(json_equal(v, e) for e in self.enum or ()))
        if self.regex is not None:
            checks.append(lambda v: self.regex.fullmatch(v) is not None if isinstance(v, str) else None)
        if self.path_prefix is not None:
            checks.append(self._check_prefix)
        if self.min is not None or self.max is not None:
            checks.append(self._check_range)
        if self.max_length is not None:
            checks.append(lambda v: len(v) <= (self.max_length or 0) if isinstance(v, str | list) else None)
        return checks

    def _check_prefix(self, value: Any) -> bool | None:
        if not isinstance(value, str) or not value.startswith("/"):
            return None
        parts = normalize_path(value)
        if parts is None or self.path_prefix is None:
            return None
        return parts[: len(self.path_prefix)] == self.path_prefix

    def _check_range(self, value: Any) -> bool | None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


def all3(results: Any) -> bool | None:
    """Three-valued AND: False if any is False, else None if any is unknown, else True."""
    unknown = False
    for r in results:
        if r is False:
            return False
        if r is None:
            unknown = True
    return None if unknown else True


def normalize_path(text: str) -> tuple[str, ...] | None:
    """Components of a POSIX path with '.' and '..' resolved; None if it has NUL or a backslash (which some
    upstreams treat as a separator) or if '..' climbs above the start."""
    if "\x00" in text or "\\" in text:
        return None
    parts: list[str] = []
    for seg in text.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(seg)
    return tuple(parts)


def json_type_matches(value: Any, type_name: str | None) -> bool:
    match type_name:
        case "string":
            return isinstance(value, str)
        case "integer":
            return (isinstance(value, int) and not isinstance(value, bool)) or (
                isinstance(value, float) and value.is_integer())
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
        case "boolean":
            return isinstance(value, bool)
        case "array":
            return isinstance(value, list | tuple)
        case "object":
            return isinstance(value, Mapping)
        case "null":
            return value is None
    return False


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: ``true`` is not ``1``, ``1`` equals ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, Sequence) and not isinstance(a, str):
        return (isinstance(b, Sequence) and not isinstance(b, str) and len(a) == len(b)
                and all(json_equal(x, y) for x, y in zip(a, b, strict=True)))
    if isinstance(a, Mapping):
        return (isinstance(b, Mapping) and a.keys() == b.keys()
                and all(json_equal(a[k], b[k]) for k in a))
    return (type(a) is type(b) and bool(a == b)) or (
        isinstance(a, int | float) and isinstance(b, int | float) and a == b)


def _lookup(arguments: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = arguments
    for seg in path:
        if not isinstance(value, Mapping) or seg not in value:
            return _ABSENT
        value = value[seg]
    return value


def _quiet_options() -> Any:
    # RE2 otherwise logs every syntax error to stderr itself; ours carries file, line and key instead.
    options = re2.Options()
    options.log_errors = False
    return options


def _re2_message(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else str(exc)
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
