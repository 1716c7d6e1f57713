"""A fast path for simple schemas: proves a value valid without jsonschema, or says it cannot.

Most tool schemas are a handful of typed properties, ``required`` and perhaps ``additionalProperties: false``.
jsonschema checks such a value by building a validator object per subschema and a generator per keyword, which
costs tens of microseconds per call. A schema whose keywords all fall in the subset below is compiled once more,
into plain closures, and a value is first checked with those.

The fast path answers only "valid" or "don't know", never "invalid": a value it cannot prove valid (a violation,
a type it does not handle, a budget it would exceed) goes to jsonschema, which finds the violations and writes
the report exactly as before. So reports do not change; only the cost of values that pass does. For a value it
calls valid, jsonschema would also have found no violation and spent the same number of steps of the budget
(``max_validation_steps``): each check counts one step per keyword that jsonschema would evaluate, in the same
places, and the caller compares the total with the budget.

Supported: the 2020-12 dialect (the MCP default) without references; keywords ``type``, ``enum``, ``const``,
``properties``, ``required``, ``additionalProperties``, ``items`` (without ``prefixItems``), ``min/maxLength``,
``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``min/maxItems``, ``min/maxProperties``,
``pattern`` (the tool's RE2 programs) and ``format``; keywords jsonschema ignores (``title``, ``description``,
``$defs``...) are ignored here too. Anything else leaves the schema to jsonschema alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jsonschema.exceptions import FormatError

from bastion.validation.engine import DEFAULT_DIALECT, FORMAT_CHECKER, Dialect

# Steps spent proving a value valid, or -1: the fast path cannot (the value may be invalid; ask jsonschema).
Check = Callable[[Any], int]

# Nesting beyond this is left to jsonschema: keeps the closures' recursion far from Python's stack limit.
MAX_FAST_DEPTH = 16

# The exact types a parsed JSON value is made of. Anything else (a subclass, a tuple) is left to jsonschema, so the
# checks below can compare types with ``is`` and still agree with jsonschema's ``isinstance`` type checker.
_JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _never(value: Any) -> int:
    return -1


def _free(value: Any) -> int:
    return 0


def _is_integer(value: Any) -> bool:
    # 2020-12: an integer is an int (not a bool) or a float with no fractional part.
    kind = type(value)
    return kind is int or (kind is float and value.is_integer())


_TYPE_TESTS: Mapping[str, Callable[[Any], bool]] = {
    "string": lambda value: type(value) is str,
    "integer": _is_integer,
    "number": lambda value: type(value) is int or type(value) is float,
    "boolean": lambda value: type(value) is bool,
    "null": lambda value: value is None,
    "object": lambda value: type(value) is dict,
    "array": lambda value: type(value) is list,
}

# A node test: True when the keyword holds for the value (or does not apply to its type).
Test = Callable[[Any], bool]


def compile_fast(schema: Any, dialect: Dialect, patterns: Mapping[str, Any]) -> Check | None:
    """The fast check of ``schema``, or None when the schema uses anything outside the supported subset."""
    if dialect is not DEFAULT_DIALECT:
        return None
    try:
        return _Compiler(dialect, patterns).node(schema, 0)
    except _Unsupported:
        return None


class LazyCheck:
    """``compile_fast`` on a schema's first validation, not when the catalogue is built.

    A catalogue of thousands of tools is built at start-up and on every change, and most tools are never called:
    compiling every fast path up front more than doubled the objects a first build left behind (the collector
    then walked them all), for checks most tools never run. Compiled once, on first use, then reused.
    """

    __slots__ = ("_check", "_source")

    def __init__(self, schema: Any, dialect: Dialect, patterns: Mapping[str, Any]) -> None:
        self._source: tuple[Any, Dialect, Mapping[str, Any]] | None = (schema, dialect, patterns)
        self._check: Check | None = None

    def get(self) -> Check | None:
        if self._source is not None:
            self._check = compile_fast(*self._source)
            self._source = None
        return self._check


class _Unsupported(Exception):
    pass


class _Compiler:
    def __init__(self, dialect: Dialect, patterns: Mapping[str, Any]) -> None:
        self._keywords = frozenset(dialect.validator_class.VALIDATORS)
        self._patterns = patterns

    def node(self, schema: Any, depth: int) -> Check:
        if schema is True:
            return _free  # jsonschema returns at once for a true schema: no keyword, no step
        if schema is False:
            return _never
        if type(schema) is not dict or depth > MAX_FAST_DEPTH:
            raise _Unsupported
        tests: list[Test] = []
        children: list[Callable[[Any], int]] = []
        steps = 0
        for keyword, value in schema.items():
            if keyword not in self._keywords:
                continue  # an annotation ($defs, title, description...): jsonschema skips it, spending nothing
            steps += 1
            built = self._keyword(keyword, value, schema, depth)
            if isinstance(built, _Descend):
                children.append(built.check)
            else:
                tests.append(built)
        return _node(tuple(tests), tuple(children), steps)

    def _keyword(self, keyword: str, value: Any, schema: Mapping[str, Any], depth: int) -> Test | _Descend:
        if keyword == "type":
            names = value if isinstance(value, list) else [value]
            if not names or any(not isinstance(n, str) or n not in _TYPE_TESTS for n in names):
                raise _Unsupported
            tests = tuple(_TYPE_TESTS[n] for n in names)
            return tests[0] if len(tests) == 1 else (lambda v: any(t(v) for t in tests))
        if keyword == "enum":
            if not isinstance(value, list):
                raise _Unsupported
            return _member_test(value)
        if keyword == "const":
            return _member_test([value])
        if keyword == "required":
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise _Unsupported
            required = tuple(value)
            return lambda v: type(v) is not dict or all(n in v for n in required)
        if keyword in _BOUNDS:
            if type(value) not in (int, float):
                raise _Unsupported
            return _BOUNDS[keyword](value)
        if keyword == "pattern":
            regex = self._patterns.get(value) if isinstance(value, str) else None
            if regex is None:
                raise _Unsupported
            return lambda v: type(v) is not str or regex.search(v) is not None
        if keyword == "format":
            if not isinstance(value, str):
                raise _Unsupported
            return _format_test(value)
        if keyword == "properties":
            if type(value) is not dict:
                raise _Unsupported
            return _Descend(_properties({name: self.node(sub, depth + 1) for name, sub in value.items()}))
        if keyword == "additionalProperties":
            if "patternProperties" in schema:
                raise _Unsupported
            known = schema.get("properties", {})
            if type(known) is not dict:
                raise _Unsupported
            return _Descend(_additional(frozenset(known), value, self.node(value, depth + 1)
                                        if type(value) is dict else None))
        if keyword == "items":
            if "prefixItems" in schema:
                raise _Unsupported
            return _Descend(_items(self.node(value, depth + 1)))
        raise _Unsupported


class _Descend:
    """A keyword that applies subschemas: its check returns the steps the subschemas spent (or -1)."""

    __slots__ = ("check",)

    def __init__(self, check: Callable[[Any], int]) -> None:
        self.check = check


def _node(tests: tuple[Test, ...], children: tuple[Callable[[Any], int], ...], steps: int) -> Check:
    def check(value: Any) -> int:
        if type(value) not in _JSON_TYPES:
            return -1
        for test in tests:
            if not test(value):
                return -1
        total = steps
        for child in children:
            spent = child(value)
            if spent < 0:
                return -1
            total += spent
        return total

    return check


def _member_test(allowed: list[Any]) -> Test:
    # Same type and equal: then jsonschema's ``equal`` agrees. A value equal only across types (1 and 1.0), or a
    # container, is left to jsonschema.
    members = tuple((type(item), item) for item in allowed if type(item) in _SCALARS)

    def test(value: Any) -> bool:
        kind = type(value)
        return any(kind is k and value == item for k, item in members)

    return test


def _bound(compare: Callable[[Any, Any], bool], sized: type[Any] | None) -> Callable[[Any], Test]:
    def make(limit: Any) -> Test:
        if sized is None:  # a number: bools are not numbers to jsonschema
            return lambda v: not (type(v) is int or type(v) is float) or compare(v, limit)
        return lambda v: type(v) is not sized or compare(len(v), limit)

    return make


_BOUNDS: Mapping[str, Callable[[Any], Test]] = {
    "minimum": _bound(lambda v, limit: not v < limit, None),
    "maximum": _bound(lambda v, limit: not v > limit, None),
    "exclusiveMinimum": _bound(lambda v, limit: not v <= limit, None),
    "exclusiveMaximum": _bound(lambda v, limit: not v >= limit, None),
    "minLength": _bound(lambda n, limit: not n < limit, str),
    "maxLength": _bound(lambda n, limit: not n > limit, str),
    "minItems": _bound(lambda n, limit: not n < limit, list),
    "maxItems": _bound(lambda n, limit: not n > limit, list),
    "minProperties": _bound(lambda n, limit: not n < limit, dict),
    "maxProperties": _bound(lambda n, limit: not n > limit, dict),
}


def _format_test(name: str) -> Test:
    def test(value: Any) -> bool:
        try:
            FORMAT_CHECKER.check(value, name)
        except FormatError:
            return False
        except Exception:
            return False  # whatever jsonschema makes of it, it is not for the fast path to say
        return True

    return test


def _properties(subs: dict[str, Check]) -> Callable[[Any], int]:
    pairs = tuple(subs.items())

    def check(value: Any) -> int:
        if type(value) is not dict:
            return 0
        total = 0
        for name, sub in pairs:
            if name in value:
                spent = sub(value[name])
                if spent < 0:
                    return -1
                total += spent
        return total

    return check


def _additional(known: frozenset[str], extra: Any, sub: Check | None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if type(value) is not dict:
            return 0
        if sub is not None:
            total = 0
            for key, item in value.items():
                if key not in known:
                    spent = sub(item)
                    if spent < 0:
                        return -1
                    total += spent
            return total
        if extra is False and any(key not in known for key in value):
            return -1
        return 0

    return check


def _items(sub: Check) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if type(value) is not list:
            return 0
        total = 0
        for item in value:
            spent = sub(item)
            if spent < 0:
                return -1
            total += spent
        return total

    return check
