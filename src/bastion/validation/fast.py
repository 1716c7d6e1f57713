"""A fast path for simple schemas: proves a value valid without jsonschema, or says it cannot.

Most tool schemas are a handful of typed properties, ``required`` and perhaps ``additionalProperties: false``.
jsonschema checks such a value by building a validator object per subschema and a generator per keyword, which
costs tens of microseconds per call. A schema whose keywords all fall in the subset below is compiled once more,
into plain objects and closures (``fast_nodes.py``), and a value is first checked with those.

The fast path answers only "valid" or "don't know", never "invalid": a value it cannot prove valid (a violation,
a type it does not handle, a budget it would exceed) goes to jsonschema, which finds the violations and writes
the report exactly as before. So reports do not change; only the cost of values that pass does. For a value it
calls valid, jsonschema would also have found no violation and spent the same number of steps of the budget
(``max_validation_steps``): each check counts the steps jsonschema's keywords would spend, in the same places,
failed ``anyOf``/``oneOf`` branches included, and the caller compares the total with the budget.

Supported, in every dialect bastion accepts (2020-12, 2019-09, draft-07, draft-06, draft-04), each with its own
semantics: ``type`` (draft-04's integer excludes 1.0), ``enum``, ``const`` (not a keyword in draft-04, so ignored
there), ``properties``, ``required``, ``additionalProperties`` (without ``patternProperties``), ``items`` holding
one schema (not the tuple form, not beside 2020-12's ``prefixItems``), ``minimum``/``maximum`` (with draft-04's
boolean ``exclusiveMinimum``/``exclusiveMaximum``), numeric ``exclusiveMinimum``/``exclusiveMaximum`` (draft-06
on), ``min/maxLength``, ``min/maxItems``, ``min/maxProperties``, ``pattern`` (the tool's RE2 programs),
``format``, ``allOf``, ``anyOf``, ``oneOf`` and ``$ref`` to a subschema of the same document that does not lead
back to itself (drafts 4 to 7 ignore a ``$ref``'s siblings, and so does the fast path). Keywords jsonschema
ignores (``title``, ``description``, ``default``, ``examples``, ``$defs``...) are ignored here too. Anything else
leaves the schema to jsonschema alone.

Keywords are recognised by the function the dialect's validator runs for them (``engine.py`` keeps it reachable),
not by name: a dialect or a jsonschema release that implements a keyword differently is left to jsonschema until
this module learns that variant.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sized
from typing import TYPE_CHECKING, Any

from referencing.exceptions import Unresolvable

from bastion.validation.engine import ROOTED_REGISTRY, Dialect, step_cost
from bastion.validation.fast_nodes import (
    FALSE,
    JSON_TYPES,
    TRUE,
    TYPE_NAMES,
    Additional,
    AllOf,
    AnyOf,
    Applicator,
    Compiled,
    Items,
    Keyword,
    Node,
    OneOf,
    Properties,
    Ref,
    Test,
    always,
    closed_test,
    format_test,
    member_test,
    number_test,
    pattern_test,
    required_test,
    size_test,
    type_test,
)

if TYPE_CHECKING:
    # referencing exports Resolver only from its private module.
    from referencing._core import Resolver

# Steps spent proving a value valid, or -1: the fast path cannot (the value may be invalid; ask jsonschema).
Check = Callable[[Any], int]

# Nesting (references and branches included) beyond this is left to jsonschema: keeps the recursion of the
# compiled checks far from Python's stack limit.
MAX_FAST_DEPTH = 16


def compile_fast(schema: Any, dialect: Dialect, patterns: Mapping[str, Any]) -> Check | None:
    """The fast check of ``schema``, or None when the schema uses anything outside the supported subset."""
    node = compile_node(schema, dialect, patterns)
    return None if node is None else node.check


def compile_node(schema: Any, dialect: Dialect, patterns: Mapping[str, Any]) -> Compiled | None:
    """The compiled root of ``schema`` (``fast_nodes.py``), or None when it is outside the supported subset."""
    try:
        return _Compiler(dialect, patterns).root(schema)
    except (_Unsupported, Unresolvable, RecursionError):
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


_NUMBER_BOUNDS: Mapping[str, Callable[[Any, Any], bool]] = {
    "minimum": operator.ge, "maximum": operator.le, "exclusiveMinimum": operator.gt, "exclusiveMaximum": operator.lt,
}
_SIZE_BOUNDS: Mapping[str, tuple[type[Sized], Callable[[Any, Any], bool]]] = {
    "minLength": (str, operator.ge), "maxLength": (str, operator.le),
    "minItems": (list, operator.ge), "maxItems": (list, operator.le),
    "minProperties": (dict, operator.ge), "maxProperties": (dict, operator.le),
}


class _Compiler:
    """Compiles subschemas the way jsonschema walks them: the same keywords (the dialect's, in the order it
    applies them), the same reference resolution (a ``referencing`` resolver entering each subschema as
    ``descend`` does), each keyword matched to the implementation the dialect's validator runs."""

    def __init__(self, dialect: Dialect, patterns: Mapping[str, Any]) -> None:
        cls = dialect.validator_class
        self._validators: Mapping[str, Any] = cls.VALIDATORS
        self._applicable: Callable[[Mapping[str, Any]], Any] = cls._APPLICABLE_VALIDATORS
        self._integral_floats = bool(cls.TYPE_CHECKER.is_type(1.0, "integer"))
        self._specification = dialect.specification
        self._patterns = patterns
        # Compiled subschemas by (object, base URI, depth): a subschema referenced from many places is compiled
        # once per depth, so a schema of references to references cannot make compiling exponential.
        self._done: dict[tuple[int, str, int], Compiled] = {}
        # Subschemas being compiled: meeting one again is a cycle (a recursive $ref), left to jsonschema.
        self._open: set[tuple[int, str]] = set()

    def root(self, schema: Any) -> Compiled:
        # The resolver compile.py gives the root validator: the root is not entered again.
        resolver = ROOTED_REGISTRY.resolver_with_root(self._specification.create_resource(schema))
        return self._node(schema, resolver, 0, root=True)

    def descend(self, schema: Any, resolver: Resolver[Any], depth: int) -> Compiled:
        """A subschema jsonschema reaches by ``descend`` without a resolver: it enters the subschema's resource."""
        if type(schema) is dict:
            resolver = resolver.in_subresource(self._specification.create_resource(schema))
        return self._node(schema, resolver, depth)

    def _node(self, schema: Any, resolver: Resolver[Any], depth: int, root: bool = False) -> Compiled:
        if schema is True:
            return TRUE
        if schema is False:
            return FALSE
        if type(schema) is not dict or depth > MAX_FAST_DEPTH:
            raise _Unsupported
        if "$schema" in schema and not root:
            # jsonschema's ``evolve`` picks the validator class for a subschema by its ``$schema``.
            raise _Unsupported
        base = str(resolver._base_uri)
        key = (id(schema), base, depth)
        done = self._done.get(key)
        if done is not None:
            return done
        where = (id(schema), base)
        if where in self._open:
            raise _Unsupported
        self._open.add(where)
        keywords: list[Keyword] = []
        for keyword, value in self._applicable(schema):
            implementation = self._validators.get(keyword)
            if implementation is None:
                continue  # an annotation (title, $defs, default...): jsonschema skips it, spending nothing
            inner = getattr(implementation, "__wrapped__", None)
            rule = _RULES.get(getattr(inner, "__name__", ""))
            if rule is None:
                raise _Unsupported
            built = rule(self, value, schema, resolver, depth + 1)
            if isinstance(built, tuple):
                keywords.append((step_cost(keyword), None, built[0]))
            else:
                keywords.append((step_cost(keyword), built, None))
        self._open.discard(where)
        node = Node(keywords)
        self._done[key] = node
        return node

    # -- keyword rules: a test, or a one-element tuple holding an applicator ---------------------------------

    def type(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> Test:
        names = value if type(value) is list else [value]
        if not names or any(type(n) is not str or n not in TYPE_NAMES for n in names):
            raise _Unsupported
        return type_test(names, self._integral_floats)

    def enum(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> Test:
        if type(value) is not list or any(type(m) not in JSON_TYPES for m in value):
            raise _Unsupported
        return member_test(value)

    def const(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> Test:
        if type(value) not in JSON_TYPES:
            raise _Unsupported
        return member_test([value])

    def required(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> Test:
        if type(value) is not list or any(type(n) is not str for n in value):
            raise _Unsupported
        return required_test(value)

    def bound(self, keyword: str, value: Any) -> Test:
        if type(value) is not int and type(value) is not float:
            raise _Unsupported
        if keyword in _NUMBER_BOUNDS:
            return number_test(_NUMBER_BOUNDS[keyword], value)
        sized, compare = _SIZE_BOUNDS[keyword]
        return size_test(sized, compare, value)

    def bound_draft4(self, keyword: str, value: Any, schema: dict[str, Any]) -> Test:
        # Draft-04: a truthy ``exclusiveMinimum``/``exclusiveMaximum`` beside it makes the bound exclusive (the
        # booleans are no keywords of their own there: they spend nothing).
        exclusive = bool(schema.get("exclusiveMinimum" if keyword == "minimum" else "exclusiveMaximum", False))
        if exclusive:
            keyword = "exclusiveMinimum" if keyword == "minimum" else "exclusiveMaximum"
        return self.bound(keyword, value)

    def pattern(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> Test:
        regex = self._patterns.get(value) if type(value) is str else None
        if regex is None:
            raise _Unsupported
        return pattern_test(regex)

    def format(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> Test:
        if type(value) is not str:
            raise _Unsupported
        return format_test(value)

    def properties(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any],
                   depth: int) -> tuple[Applicator]:
        if type(value) is not dict:
            raise _Unsupported
        return (Properties((name, self.descend(sub, resolver, depth)) for name, sub in value.items()),)

    def additional(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any],
                   depth: int) -> Test | tuple[Applicator]:
        # bastion's implementation: keys neither ``properties`` nor ``patternProperties`` cover.
        known = schema.get("properties", {})
        if "patternProperties" in schema or type(known) is not dict:
            raise _Unsupported
        if type(value) is dict:
            return (Additional(frozenset(known), self.descend(value, resolver, depth)),)
        if value is True:
            return always
        if value is False:
            return closed_test(frozenset(known))
        raise _Unsupported

    def items(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> tuple[Applicator]:
        # 2020-12: ``items`` applies past ``prefixItems``; without those, to every element. A false ``items``
        # yields one error where a false subschema per element would: both spend nothing.
        if "prefixItems" in schema:
            raise _Unsupported
        return self._every_item(value, resolver, depth)

    def items_draft6(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any],
                     depth: int) -> tuple[Applicator]:
        if type(value) is list:
            raise _Unsupported  # the tuple form: each element its own schema, ``additionalItems`` past them
        return self._every_item(value, resolver, depth)

    def items_draft4(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any],
                     depth: int) -> tuple[Applicator]:
        if type(value) is not dict:
            raise _Unsupported  # draft-04 applies one schema only when it is an object; anything else is a tuple
        return self._every_item(value, resolver, depth)

    def _every_item(self, value: Any, resolver: Resolver[Any], depth: int) -> tuple[Applicator]:
        if type(value) is not dict and type(value) is not bool:
            raise _Unsupported
        return (Items(self.descend(value, resolver, depth)),)

    def branches(self, value: Any, resolver: Resolver[Any], depth: int) -> list[Compiled]:
        if type(value) is not list or not value:
            raise _Unsupported
        return [self.descend(sub, resolver, depth) for sub in value]

    def all_of(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> tuple[Applicator]:
        return (AllOf(self.branches(value, resolver, depth)),)

    def any_of(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> tuple[Applicator]:
        return (AnyOf(self.branches(value, resolver, depth)),)

    def one_of(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> tuple[Applicator]:
        # The branches after the one that passes are checked by a validator evolved to the branch without
        # entering its resource: the same resolver only if no branch sets a base URI of its own.
        branches = self.branches(value, resolver, depth)
        for sub in value:
            if type(sub) is dict and resolver.in_subresource(self._specification.create_resource(sub)) is not resolver:
                raise _Unsupported
        return (OneOf(branches),)

    def ref(self, value: Any, schema: dict[str, Any], resolver: Resolver[Any], depth: int) -> tuple[Applicator]:
        if type(value) is not str:
            raise _Unsupported
        try:
            resolved = resolver.lookup(value)
        except Exception as exc:
            # The scan resolved every reference it walks to; one it did not (inside a non-keyword location) may
            # fail in any way (a pointer into an array with a non-numeric segment): jsonschema's business.
            raise _Unsupported from exc
        # As ``_validate_reference``: descend into the target with the resolver the lookup returned.
        return (Ref(self._node(resolved.contents, resolved.resolver, depth)),)


Rule = Callable[[_Compiler, Any, dict[str, Any], "Resolver[Any]", int], "Test | tuple[Applicator]"]


def _bound(keyword: str) -> Rule:
    return lambda c, value, schema, resolver, depth: c.bound(keyword, value)


def _bound_draft4(keyword: str) -> Rule:
    return lambda c, value, schema, resolver, depth: c.bound_draft4(keyword, value, schema)


# Keyed by the name of the function the dialect's validator runs for the keyword (jsonschema's, or bastion's own
# for ``pattern``, ``properties`` and ``additionalProperties``); see the module docstring.
_RULES: Mapping[str, Rule] = {
    "type": _Compiler.type,
    "enum": _Compiler.enum,
    "const": _Compiler.const,
    "required": _Compiler.required,
    **{name: _bound(name) for name in (*_NUMBER_BOUNDS, *_SIZE_BOUNDS)},
    "minimum_draft3_draft4": _bound_draft4("minimum"),
    "maximum_draft3_draft4": _bound_draft4("maximum"),
    "_pattern": _Compiler.pattern,
    "format": _Compiler.format,
    "_properties": _Compiler.properties,
    "_additional_properties": _Compiler.additional,
    "items": _Compiler.items,
    "items_draft6_draft7_draft201909": _Compiler.items_draft6,
    "items_draft3_draft4": _Compiler.items_draft4,
    "allOf": _Compiler.all_of,
    "anyOf": _Compiler.any_of,
    "oneOf": _Compiler.one_of,
    "ref": _Compiler.ref,
}
