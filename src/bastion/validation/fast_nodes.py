"""The fast path's runtime: compiled subschemas, the keywords that apply them, and the outcomes they compute.

A compiled subschema (``Node``, or ``TRUE``/``FALSE``) answers two questions about a value, each exactly as
jsonschema would answer it (same verdict, same steps of the budget), or not at all:

- ``check(value)``, the hot path: the steps jsonschema spends finding ``value`` valid, or -1 when the value may not
  be valid (it stops at the first keyword that fails, and leaves the rest to jsonschema);
- ``settle(value, lazy)``, an *outcome*: ``n >= 0`` when jsonschema finds the value valid after ``n`` steps, ``~n``
  (``-n - 1``) when it finds it invalid after ``n`` steps, None when the fast path cannot tell. With ``lazy``
  false, the steps are those of ``list(descend(...))``, which evaluates every keyword: ``anyOf`` and ``oneOf`` run
  it on the branches before the first that passes. With ``lazy`` true they are those of ``is_valid``, which stops
  at the first error: ``oneOf`` runs it on the branches after the one that passes.

Keyword tests are three-valued: True (holds, or does not apply to the value's type), False (fails), None (cannot
tell: a value only jsonschema's ``equal`` can compare, a check that raised). A test must be exact when it answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sized
from typing import Any, Protocol

from jsonschema.exceptions import FormatError

from bastion.validation.engine import FORMAT_CHECKER

# The exact types a parsed JSON value is made of. Anything else (a subclass, a tuple) is left to jsonschema, so the
# checks below can compare types with ``is`` and still agree with jsonschema's ``isinstance`` type checkers.
JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})

Test = Callable[[Any], "bool | None"]
Outcome = int | None


class Compiled(Protocol):
    """A compiled subschema."""

    check: Callable[[Any], int]

    def settle(self, value: Any, lazy: bool) -> Outcome: ...


class Applicator(Protocol):
    """A keyword that applies subschemas: both methods count the subschemas' steps, not the keyword's own."""

    def check(self, value: Any) -> int: ...

    def settle(self, value: Any, lazy: bool) -> Outcome: ...


# One keyword of a node, in jsonschema's order: its step cost, and either a test or an applicator.
Keyword = tuple[int, Test | None, Applicator | None]


def _free(value: Any) -> int:
    return 0


def _never(value: Any) -> int:
    return -1


class _Constant:
    """A boolean schema: jsonschema answers at once, spending nothing, whatever the value."""

    __slots__ = ("_outcome", "check")

    def __init__(self, valid: bool) -> None:
        self.check: Callable[[Any], int] = _free if valid else _never
        self._outcome = 0 if valid else ~0

    def settle(self, value: Any, lazy: bool) -> Outcome:
        return self._outcome


TRUE = _Constant(True)
FALSE = _Constant(False)


class Node:
    """A schema object: its keywords in the order jsonschema evaluates them."""

    __slots__ = ("_keywords", "check")

    def __init__(self, keywords: Iterable[Keyword]) -> None:
        self._keywords = tuple(keywords)
        steps = sum(cost for cost, _, _ in self._keywords)
        tests = tuple(test for _, test, _ in self._keywords if test is not None)
        applied = tuple(applicator.check for _, _, applicator in self._keywords if applicator is not None)
        self.check = _checker(tests, applied, steps)

    def settle(self, value: Any, lazy: bool) -> Outcome:
        if type(value) not in JSON_TYPES:
            return None
        total = 0
        valid = True
        for cost, test, applicator in self._keywords:
            total += cost  # spent when jsonschema calls the keyword, before it yields anything
            if test is not None:
                held = test(value)
                if held:
                    continue
                if held is None:
                    return None
            else:
                assert applicator is not None
                spent = applicator.settle(value, lazy)
                if spent is None:
                    return None
                if spent >= 0:
                    total += spent
                    continue
                total += ~spent
            if lazy:
                return ~total
            valid = False
        return total if valid else ~total


def _checker(tests: tuple[Test, ...], applied: tuple[Callable[[Any], int], ...], steps: int) -> Callable[[Any], int]:
    # For a valid value jsonschema evaluates every keyword, so the order does not change the steps: the tests run
    # first, the cheapest way to a "don't know".
    def check(value: Any) -> int:
        if type(value) not in JSON_TYPES:
            return -1
        for test in tests:
            if not test(value):
                return -1
        total = steps
        for apply in applied:
            spent = apply(value)
            if spent < 0:
                return -1
            total += spent
        return total

    return check


def fold(pairs: Iterable[tuple[Compiled, Any]], lazy: bool) -> Outcome:
    """The outcome of descending into each (subschema, value) in turn, as a keyword's generator does."""
    total = 0
    valid = True
    for node, value in pairs:
        spent = node.settle(value, lazy)
        if spent is None:
            return None
        if spent >= 0:
            total += spent
            continue
        total += ~spent
        if lazy:
            return ~total
        valid = False
    return total if valid else ~total


def _valid_steps(outcome: Outcome) -> int:
    return outcome if outcome is not None and outcome >= 0 else -1


# -- applicators ---------------------------------------------------------------------------------------------


class Properties:
    """``properties`` (bastion's: a false subschema fails without descending, which spends nothing either)."""

    __slots__ = ("_pairs",)

    def __init__(self, pairs: Iterable[tuple[str, Compiled]]) -> None:
        self._pairs = tuple(pairs)

    def check(self, value: Any) -> int:
        if type(value) is not dict:
            return 0
        total = 0
        for name, sub in self._pairs:
            if name in value:
                spent = sub.check(value[name])
                if spent < 0:
                    return -1
                total += spent
        return total

    def settle(self, value: Any, lazy: bool) -> Outcome:
        if type(value) is not dict:
            return 0
        return fold([(sub, value[name]) for name, sub in self._pairs if name in value], lazy)


class Additional:
    """``additionalProperties`` with a schema object, beside no ``patternProperties``: each key ``properties``
    does not name, in the value's order."""

    __slots__ = ("_known", "_sub")

    def __init__(self, known: frozenset[str], sub: Compiled) -> None:
        self._known = known
        self._sub = sub

    def check(self, value: Any) -> int:
        if type(value) is not dict:
            return 0
        known, sub = self._known, self._sub
        total = 0
        for key, item in value.items():
            if key not in known:
                spent = sub.check(item)
                if spent < 0:
                    return -1
                total += spent
        return total

    def settle(self, value: Any, lazy: bool) -> Outcome:
        if type(value) is not dict:
            return 0
        return fold([(self._sub, item) for key, item in value.items() if key not in self._known], lazy)


class Items:
    """``items`` holding one schema, applied to every element (no tuple form, no ``prefixItems``)."""

    __slots__ = ("_sub",)

    def __init__(self, sub: Compiled) -> None:
        self._sub = sub

    def check(self, value: Any) -> int:
        if type(value) is not list:
            return 0
        sub = self._sub.check
        total = 0
        for item in value:
            spent = sub(item)
            if spent < 0:
                return -1
            total += spent
        return total

    def settle(self, value: Any, lazy: bool) -> Outcome:
        if type(value) is not list:
            return 0
        return fold([(self._sub, item) for item in value], lazy)


class Ref:
    """``$ref`` to a subschema of the same document, resolved once at compile time as jsonschema resolves it."""

    __slots__ = ("_target", "check")

    def __init__(self, target: Compiled) -> None:
        self._target = target
        self.check = target.check

    def settle(self, value: Any, lazy: bool) -> Outcome:
        return self._target.settle(value, lazy)


class AllOf:
    __slots__ = ("_branches",)

    def __init__(self, branches: Iterable[Compiled]) -> None:
        self._branches = tuple(branches)

    def check(self, value: Any) -> int:
        total = 0
        for branch in self._branches:
            spent = branch.check(value)
            if spent < 0:
                return -1
            total += spent
        return total

    def settle(self, value: Any, lazy: bool) -> Outcome:
        return fold([(branch, value) for branch in self._branches], lazy)


class AnyOf:
    """jsonschema evaluates each branch in full (``list(descend(...))``) until one passes: proving the value valid
    takes proving every earlier branch invalid, and counting what they cost. The error, when there is one, comes
    after all of that, so ``lazy`` changes nothing."""

    __slots__ = ("_branches",)

    def __init__(self, branches: Iterable[Compiled]) -> None:
        self._branches = tuple(branches)

    def check(self, value: Any) -> int:
        return _valid_steps(self.settle(value, False))

    def settle(self, value: Any, lazy: bool) -> Outcome:
        total = 0
        for branch in self._branches:
            spent = branch.settle(value, False)
            if spent is None:
                return None
            if spent >= 0:
                return total + spent
            total += ~spent
        return ~total


class OneOf:
    """jsonschema evaluates branches in full until one passes, then every later branch with ``is_valid`` (which
    stops at its first error); any later branch that passes makes the value invalid. Both errors come after all
    of that, so ``lazy`` changes nothing."""

    __slots__ = ("_branches",)

    def __init__(self, branches: Iterable[Compiled]) -> None:
        self._branches = tuple(branches)

    def check(self, value: Any) -> int:
        return _valid_steps(self.settle(value, False))

    def settle(self, value: Any, lazy: bool) -> Outcome:
        total = 0
        branches = iter(self._branches)
        for branch in branches:
            spent = branch.settle(value, False)
            if spent is None:
                return None
            if spent >= 0:
                total += spent
                break
            total += ~spent
        else:
            return ~total
        valid = True
        for branch in branches:
            spent = branch.settle(value, True)
            if spent is None:
                return None
            if spent >= 0:
                valid = False
                total += spent
            else:
                total += ~spent
        return total if valid else ~total


# -- tests -----------------------------------------------------------------------------------------------------


def always(value: Any) -> bool:
    """A keyword that spends its step and can never fail (``additionalProperties: true``)."""
    return True


_TYPE_CLASSES: Mapping[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "null": (type(None),),
    "object": (dict,), "array": (list,),
}
TYPE_NAMES = frozenset(_TYPE_CLASSES)


def type_test(names: Iterable[str], integral_floats: bool) -> Test:
    """``type``. ``integral_floats``: whether the dialect's "integer" admits 1.0 (every dialect after draft-04)."""
    names = tuple(names)
    kinds = frozenset(kind for name in names for kind in _TYPE_CLASSES[name])
    if "integer" in names and float not in kinds and integral_floats:
        return lambda value: type(value) in kinds or (type(value) is float and value.is_integer())
    return lambda value: type(value) in kinds


def member_test(allowed: Iterable[Any]) -> Test:
    """``enum`` (``const`` is one member), with jsonschema's ``equal``: strings equal strings, ``true`` only
    ``true``, numbers equal numbers across int and float (1 == 1.0), a scalar never equals a container. Containers
    are compared by jsonschema alone."""
    members = list(allowed)
    strings = frozenset(m for m in members if type(m) is str)
    # A set finds an equal number whatever its type: equal ints and floats hash alike.
    numbers = frozenset(m for m in members if type(m) is int or type(m) is float)
    has_true = any(m is True for m in members)
    has_false = any(m is False for m in members)
    has_null = any(m is None for m in members)
    has_container = any(type(m) is list or type(m) is dict for m in members)

    def test(value: Any) -> bool | None:
        kind = type(value)
        if kind is str:
            return value in strings
        if kind is int or kind is float:
            return value in numbers
        if kind is bool:
            return has_true if value else has_false
        if value is None:
            return has_null
        return None if has_container else False

    return test


def closed_test(known: frozenset[str]) -> Test:
    """``additionalProperties: false``."""

    def test(value: Any) -> bool:
        if type(value) is not dict:
            return True
        for key in value:  # noqa: SIM110 (a loop: no generator per call)
            if key not in known:
                return False
        return True

    return test


def required_test(names: Iterable[str]) -> Test:
    required = tuple(names)

    def test(value: Any) -> bool:
        if type(value) is not dict:
            return True
        for name in required:  # noqa: SIM110 (a loop: no generator per call)
            if name not in value:
                return False
        return True

    return test


def number_test(compare: Callable[[Any, Any], bool], limit: Any) -> Test:
    # Booleans are not numbers to jsonschema.
    return lambda value: not (type(value) is int or type(value) is float) or compare(value, limit)


def size_test(sized: type[Sized], compare: Callable[[int, Any], bool], limit: Any) -> Test:
    def test(value: Any) -> bool:
        return type(value) is not sized or compare(len(value), limit)

    return test


def pattern_test(regex: Any) -> Test:
    def test(value: Any) -> bool | None:
        if type(value) is not str:
            return True
        try:
            return regex.search(value) is not None
        except Exception:
            return None  # RE2 refuses some strings (lone surrogates): whatever jsonschema makes of it stands

    return test


def format_test(name: str) -> Test:
    if name not in FORMAT_CHECKER.checkers:
        return always  # FormatChecker.check returns at once for a format it does not know

    def test(value: Any) -> bool | None:
        try:
            FORMAT_CHECKER.check(value, name)
        except FormatError:
            return False
        except Exception:
            return None  # jsonschema would not catch it: not for the fast path to say
        return True

    return test
