"""A fast "is this schema valid against its dialect's metaschema?", exact whenever it answers yes.

jsonschema checks a schema against the metaschema by interpreting the metaschema, which for 2020-12 means seven
vocabulary metaschemas joined by ``allOf`` and a ``$dynamicRef`` lookup at every subschema: about 1.5 ms for a small
tool schema, most of the cost of building a catalogue. The metaschemas themselves are fixed data, so each is
compiled here, once, into plain Python predicates: references resolved in advance, the vocabularies' ``properties``
merged into one table looked up by the keys the schema actually has.

The predicate is only ever trusted when it says *valid*: ``compile.py`` runs jsonschema's own ``check_schema`` for
anything it does not pass, so a rejected schema gets exactly the error it always got, and a predicate that is
stricter than jsonschema (it is, where being exact would cost code: see ``_unique``) only costs time. Soundness in
the other direction is what matters: every keyword below says *valid* only where jsonschema's implementation of
that keyword yields no error. A metaschema using a keyword (or a keyword implementation) not in ``_RULES`` is not
compiled at all, and its dialect always takes the slow path; so a jsonschema upgrade that changes a metaschema
cannot make this module accept what jsonschema would refuse.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from jsonschema.validators import validator_for
from jsonschema_specifications import REGISTRY as SPECIFICATIONS  # type: ignore[import-untyped]
from referencing._core import Resolver
from referencing.jsonschema import specification_with

Check = Callable[[Any], bool]


class _Unsupported(Exception):
    """The metaschema uses something this compiler does not implement: fall back to jsonschema for the dialect."""


def compile_metaschema(validator_class: Any) -> Check | None:
    """A predicate equivalent to ``validator_class.check_schema(schema, format_checker=None)`` succeeding, whenever
    it returns True; None when the dialect's metaschema cannot be compiled (callers then always use jsonschema)."""
    meta_class = validator_for(validator_class.META_SCHEMA, default=validator_class)
    try:
        return _Compiler(meta_class).root()
    except _Unsupported:
        return None


def _is_integer_draft4(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_integer(x: Any) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and x.is_integer())


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


_TYPES: dict[str, Check] = {
    "array": lambda x: isinstance(x, list),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "number": _is_number,
    "object": lambda x: isinstance(x, dict),
    "string": lambda x: isinstance(x, str),
}


def _always(x: Any) -> bool:
    return True


def _never(x: Any) -> bool:
    return False


class _Compiler:
    def __init__(self, meta_class: Any) -> None:
        self._keywords: Mapping[str, Any] = meta_class.VALIDATORS
        # Drafts 4-7: a ``$ref`` makes jsonschema ignore its siblings.
        self._ref_only = meta_class._APPLICABLE_VALIDATORS({"$ref": "#", "x": 1}) == [("$ref", "#")]
        # The dialect's own notion of an integer (1.0 is one from draft 6 on), taken from its type checker.
        self._types = {**_TYPES, "integer": _is_integer if meta_class.TYPE_CHECKER.is_type(1.0, "integer")
                       else _is_integer_draft4}
        meta_id = meta_class.ID_OF(meta_class.META_SCHEMA)
        resolved = SPECIFICATIONS.resolver().lookup(meta_id)
        self._specification = specification_with(meta_class.META_SCHEMA.get("$schema", meta_id))
        self._root_contents = resolved.contents
        self._root_resolver = resolved.resolver
        self._compiled: dict[tuple[int, str], Check] = {}
        self._pending: dict[tuple[int, str], list[Check]] = {}
        self._inlining: set[tuple[int, str]] = set()

    def root(self) -> Check:
        return self.schema(self._root_contents, self._root_resolver)

    def schema(self, node: Any, resolver: Resolver[Any]) -> Check:
        if node is True:
            return _always
        if node is False:
            return _never
        if not isinstance(node, dict):
            raise _Unsupported("a subschema that is neither an object nor a boolean")
        resolver = resolver.in_subresource(self._specification.create_resource(node))
        key = (id(node), str(resolver._base_uri))
        done = self._compiled.get(key)
        if done is not None:
            return done
        pending = self._pending.get(key)
        if pending is not None:
            # A cycle (``$ref: "#"``): bind late, through the cell filled when the outer compile finishes.
            return lambda x: pending[0](x)
        cell: list[Check] = []
        self._pending[key] = cell
        check = self._object(node, resolver)
        cell.append(check)
        del self._pending[key]
        self._compiled[key] = check
        return check

    def _object(self, node: dict[str, Any], resolver: Resolver[Any]) -> Check:
        checks: list[Check] = []
        properties: dict[str, list[Check]] = {}
        self._keywords_of(node, resolver, checks, properties)
        return _conjunction(checks, properties)

    def inline(self, node: Any, resolver: Resolver[Any], checks: list[Check],
               properties: dict[str, list[Check]]) -> None:
        """Add the checks of subschema ``node``, applied to the same instance, to ``checks`` and ``properties``:
        all of (all of A's checks, all of B's checks) is all of the checks, and their ``properties`` share one
        table. A subschema already being compiled or inlined further up (a cycle) is called, bound late."""
        if not isinstance(node, dict):
            checks.append(self.schema(node, resolver))
            return
        resolver = resolver.in_subresource(self._specification.create_resource(node))
        key = (id(node), str(resolver._base_uri))
        if key in self._pending or key in self._inlining:
            checks.append(self.schema(node, resolver))
            return
        self._inlining.add(key)
        try:
            self._keywords_of(node, resolver, checks, properties)
        finally:
            self._inlining.discard(key)

    def _keywords_of(self, node: dict[str, Any], resolver: Resolver[Any], checks: list[Check],
                     properties: dict[str, list[Check]]) -> None:
        items = [("$ref", node["$ref"])] if self._ref_only and "$ref" in node else list(node.items())
        for keyword, value in items:
            implementation = self._keywords.get(keyword)
            if implementation is None:
                continue  # an annotation ($comment, title, default, $defs...): jsonschema ignores it too
            rule = _RULES.get(implementation.__name__)
            if rule is None:
                raise _Unsupported(f"keyword {keyword!r} ({implementation.__name__})")
            rule(self, node, value, resolver, checks, properties)

    # -- references ------------------------------------------------------------------------------------------

    def ref(self, ref: Any, resolver: Resolver[Any], checks: list[Check], properties: dict[str, list[Check]]) -> None:
        if not isinstance(ref, str):
            raise _Unsupported("a non-string reference")
        resolved = resolver.lookup(ref)
        self.inline(resolved.contents, resolved.resolver, checks, properties)

    def dynamic_root(self, anchor_key: str, anchor: Any) -> Check:
        """``$dynamicRef``/``$recursiveRef`` as jsonschema resolves them from a check against the metaschema: to
        the outermost resource of the dynamic scope carrying the anchor, which is the metaschema's root."""
        if self._root_contents.get(anchor_key) != anchor:
            raise _Unsupported(f"the metaschema root has no {anchor_key} {anchor!r}")
        return self.schema(self._root_contents, self._root_resolver)


Rule = Callable[[_Compiler, dict[str, Any], Any, Resolver[Any], list[Check], dict[str, list[Check]]], None]


def _conjunction(checks: list[Check], properties: dict[str, list[Check]]) -> Check:
    table = {name: tuple(fns) for name, fns in properties.items()}
    flat = tuple(checks)
    if table:
        def with_properties(x: Any) -> bool:
            if isinstance(x, dict):
                # Driven by the keys the schema has (a handful), not by the metaschema's dozens of keywords.
                for key, value in x.items():
                    fns = table.get(key)
                    if fns is not None:
                        for fn in fns:
                            if not fn(value):
                                return False
            for fn in flat:  # noqa: SIM110 (a loop: no generator per call)
                if not fn(x):
                    return False
            return True

        return with_properties
    if len(flat) == 1:
        return flat[0]

    def every(x: Any) -> bool:
        for fn in flat:  # noqa: SIM110 (a loop: no generator per call)
            if not fn(x):
                return False
        return True

    return every


def _type(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
          properties: dict[str, list[Check]]) -> None:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n in c._types for n in names):
        raise _Unsupported(f"type {value!r}")
    # Types that are exactly a Python class (not number or integer, which must exclude booleans) become one
    # isinstance check.
    classes = tuple(_CLASSES[n] for n in names if n in _CLASSES)
    preds = tuple(c._types[n] for n in names if n not in _CLASSES)
    if not preds:
        checks.append(lambda x: isinstance(x, classes))
    elif len(preds) == 1 and not classes:
        checks.append(preds[0])
    else:
        def any_type(x: Any) -> bool:
            if isinstance(x, classes):
                return True
            for pred in preds:  # noqa: SIM110 (a loop: no generator per call)
                if pred(x):
                    return True
            return False

        checks.append(any_type)


_CLASSES: dict[str, type] = {"array": list, "boolean": bool, "null": type(None), "object": dict, "string": str}


def _properties(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
                properties: dict[str, list[Check]]) -> None:
    if not isinstance(value, dict):
        raise _Unsupported("properties")
    for name, sub in value.items():
        properties.setdefault(name, []).append(c.schema(sub, resolver))


def _additional_properties(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any],
                           checks: list[Check], properties: dict[str, list[Check]]) -> None:
    if "patternProperties" in node:
        raise _Unsupported("additionalProperties beside patternProperties")
    declared = node.get("properties", {})
    if value is True:
        return
    sub = _never if value is False else c.schema(value, resolver)

    def additional(x: Any) -> bool:
        if isinstance(x, dict):
            for k, v in x.items():
                if k not in declared and not sub(v):
                    return False
        return True

    checks.append(additional)


def _items(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
           properties: dict[str, list[Check]]) -> None:
    # Every form of ``items`` (2020-12, drafts 6-2019-09, draft 4) applies a single schema to every element, as
    # long as there are no ``prefixItems`` and the value is a schema (a boolean one only from draft 6 on).
    name = c._keywords["items"].__name__
    if "prefixItems" in node or not (isinstance(value, dict) or (isinstance(value, bool)
                                                                  and name != "items_draft3_draft4")):
        raise _Unsupported("items")
    sub = c.schema(value, resolver)

    def every_item(x: Any) -> bool:
        if isinstance(x, list):
            for v in x:
                if not sub(v):
                    return False
        return True

    checks.append(every_item)


def _all_of(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
            properties: dict[str, list[Check]]) -> None:
    if not isinstance(value, list):
        raise _Unsupported("allOf")
    for sub in value:
        c.inline(sub, resolver, checks, properties)


def _any_of(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
            properties: dict[str, list[Check]]) -> None:
    if not isinstance(value, list) or not value:
        raise _Unsupported("anyOf")
    subs = tuple(c.schema(sub, resolver) for sub in value)

    def any_of(x: Any) -> bool:
        for sub in subs:  # noqa: SIM110 (a loop: no generator per call)
            if sub(x):
                return True
        return False

    checks.append(any_of)


def _enum(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
          properties: dict[str, list[Check]]) -> None:
    # jsonschema's ``equal`` is ``==`` whenever either side is a string; the metaschemas' enums are all strings.
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Unsupported("enum")
    allowed = frozenset(value)
    checks.append(lambda x: isinstance(x, str) and x in allowed)


def _min_items(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
               properties: dict[str, list[Check]]) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Unsupported("minItems")
    checks.append(lambda x: not isinstance(x, list) or len(x) >= value)


def _minimum(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
             properties: dict[str, list[Check]]) -> None:
    if not _is_number(value):
        raise _Unsupported("minimum")
    # Drafts 3-4: a boolean ``exclusiveMinimum`` beside ``minimum`` makes it exclusive.
    exclusive = c._keywords["minimum"].__name__ == "minimum_draft3_draft4" and bool(node.get("exclusiveMinimum"))
    if exclusive:
        checks.append(lambda x: not _is_number(x) or x > value)
    else:
        checks.append(lambda x: not _is_number(x) or x >= value)


def _exclusive_minimum(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any],
                       checks: list[Check], properties: dict[str, list[Check]]) -> None:
    if not _is_number(value):
        raise _Unsupported("exclusiveMinimum")
    checks.append(lambda x: not _is_number(x) or x > value)


def _pattern(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
             properties: dict[str, list[Check]]) -> None:
    if not isinstance(value, str):
        raise _Unsupported("pattern")
    # The metaschemas' own patterns (anchors), on Python's re exactly as jsonschema runs them: trusted input.
    regex = re.compile(value)
    checks.append(lambda x: not isinstance(x, str) or regex.search(x) is not None)


def _property_names(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
                    properties: dict[str, list[Check]]) -> None:
    sub = c.schema(value, resolver)
    checks.append(lambda x: not isinstance(x, dict) or all(sub(k) for k in x))


def _unique_items(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
                  properties: dict[str, list[Check]]) -> None:
    if value is True:
        checks.append(_unique)
    elif value is not False:
        raise _Unsupported("uniqueItems")


def _unique(x: Any) -> bool:
    """Unique under jsonschema's ``equal`` for scalars; False (ask jsonschema) for anything it cannot tell cheaply.

    A set of scalars is stricter than ``equal``: it merges ``True`` with ``1``, which ``equal`` keeps apart, so a
    list it calls unique is unique for jsonschema too."""
    if not isinstance(x, list):
        return True
    if not all(v is None or isinstance(v, str | int | float) for v in x):
        return False
    return len(set(x)) == len(x)


def _dependencies(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
                  properties: dict[str, list[Check]]) -> None:
    if not isinstance(value, dict):
        raise _Unsupported("dependencies")
    for name, dependency in value.items():
        checks.append(_required_with(name, tuple(dependency)) if isinstance(dependency, list)
                      else _schema_with(name, c.schema(dependency, resolver)))


def _required_with(name: str, needed: tuple[Any, ...]) -> Check:
    return lambda x: not isinstance(x, dict) or name not in x or all(n in x for n in needed)


def _schema_with(name: str, sub: Check) -> Check:
    return lambda x: not isinstance(x, dict) or name not in x or sub(x)


def _ref(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
         properties: dict[str, list[Check]]) -> None:
    c.ref(value, resolver, checks, properties)


def _dynamic_ref(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
                 properties: dict[str, list[Check]]) -> None:
    # The statically resolved target must itself be a dynamic anchor, or the reference is a plain $ref.
    if not isinstance(value, str) or not value.startswith("#") or "/" in value:
        raise _Unsupported("$dynamicRef")
    static = resolver.lookup(value).contents
    if not isinstance(static, dict) or static.get("$dynamicAnchor") != value[1:]:
        raise _Unsupported("$dynamicRef to a plain anchor")
    checks.append(c.dynamic_root("$dynamicAnchor", value[1:]))


def _recursive_ref(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
                   properties: dict[str, list[Check]]) -> None:
    if value != "#" or resolver.lookup("#").contents.get("$recursiveAnchor") is not True:
        raise _Unsupported("$recursiveRef")
    checks.append(c.dynamic_root("$recursiveAnchor", True))


def _format(c: _Compiler, node: dict[str, Any], value: Any, resolver: Resolver[Any], checks: list[Check],
            properties: dict[str, list[Check]]) -> None:
    return None  # check_schema runs with format_checker=None: ``format`` asserts nothing


# Keyed by the name of jsonschema's implementation, not the keyword: a dialect that implements a keyword
# differently (``minimum`` in draft 4, ``items`` across drafts) is matched to the rule written for that variant.
_RULES: dict[str, Rule] = {
    "type": _type,
    "properties": _properties,
    "additionalProperties": _additional_properties,
    "items": _items,
    "items_draft6_draft7_draft201909": _items,
    "items_draft3_draft4": _items,
    "allOf": _all_of,
    "anyOf": _any_of,
    "enum": _enum,
    "minItems": _min_items,
    "minimum": _minimum,
    "minimum_draft3_draft4": _minimum,
    "exclusiveMinimum": _exclusive_minimum,
    "pattern": _pattern,
    "propertyNames": _property_names,
    "uniqueItems": _unique_items,
    "dependencies_draft4_draft6_draft7": _dependencies,
    "ref": _ref,
    "dynamicRef": _dynamic_ref,
    "recursiveRef": _recursive_ref,
    "format": _format,
}
