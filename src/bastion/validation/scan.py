"""Static checks on an untrusted schema, before any instance is validated against it.

Walks the schema as its dialect defines it (``referencing`` knows which keywords hold subschemas and where ``$id``
changes the base URI) and finds what would make it unsafe or unusable: a ``$ref`` that leaves the schema, a pattern
RE2 cannot run, a keyword combination jsonschema would evaluate with Python's backtracking ``re``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from referencing import Resource
from referencing.exceptions import NoSuchAnchor, PointerToNowhere, Unresolvable

from bastion.validation.engine import REFUSING_REGISTRY, Dialect
from bastion.validation.regex import UnsupportedPattern, compile_pattern, describe

if TYPE_CHECKING:
    # referencing exports Resolver only from its private module.
    from referencing._core import Resolver

_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# Every key the walk reacts to or that changes how it resolves (``referencing``'s ids and anchors per dialect).
_SCAN_KEYS = frozenset({*_REF_KEYWORDS, "pattern", "patternProperties", "$id", "$anchor", "$dynamicAnchor",
                        "$recursiveAnchor"})
_SCAN_KEYS_LEGACY = _SCAN_KEYS | {"id"}  # draft-04 spells $id without the dollar
SCAN_KEYS = _SCAN_KEYS_LEGACY  # every key ``scan`` may look for, whatever the dialect
_MAX_REF_CHARS = 80


class UnsafeSchema(Exception):
    """The schema cannot be used. Internal: ``compile.py`` turns it into ``SchemaRejected``."""


@dataclass(frozen=True, slots=True)
class Scan:
    """What compilation needs from the walk: every pattern of the schema, compiled with RE2."""

    patterns: Mapping[str, Any]


def scan(schema: Mapping[str, Any], dialect: Dialect, *, keys: Set[str] | None = None) -> Scan:
    """Check ``schema`` (already within size and depth limits) and compile its patterns; raise ``UnsafeSchema``.
    ``keys``: which of ``SCAN_KEYS`` appear anywhere in ``schema`` as mapping keys, when the caller knows."""
    relevant = _SCAN_KEYS_LEGACY if dialect.name == "draft-04" else _SCAN_KEYS
    if (relevant.isdisjoint(keys) if keys is not None else not _mentions_any(schema, relevant)):
        # Nothing the walk looks for (references, patterns) nor anything that moves its base URI (ids, anchors)
        # appears anywhere, even as a property name: the walk would find nothing, so skip building the registry.
        return Scan(patterns={})
    resource = dialect.specification.create_resource(schema)
    root = resource.id() or ""
    registry = REFUSING_REGISTRY.with_resource(root, resource).crawl()
    resolver = registry.resolver(base_uri=root)
    patterns: dict[str, Any] = {}
    for current, sub in _walk(resolver, resource):
        contents = sub.contents
        if not isinstance(contents, Mapping):
            continue
        for keyword in _REF_KEYWORDS:
            ref = contents.get(keyword)
            if isinstance(ref, str):
                _check_ref(current, keyword, ref)
        pattern = contents.get("pattern")
        if isinstance(pattern, str):
            _compile_into(patterns, pattern)
        pattern_properties = contents.get("patternProperties")
        if isinstance(pattern_properties, Mapping):
            for key in pattern_properties:
                _compile_into(patterns, key)
    if dialect.has_unevaluated and _mentions(schema, "unevaluatedProperties") and _mentions(schema,
                                                                                          "patternProperties"):
        raise UnsafeSchema("unevaluatedProperties combined with patternProperties is not supported")
    return Scan(patterns=patterns)


def _walk(resolver: Resolver[Any], resource: Resource[Any]) -> Iterator[tuple[Resolver[Any], Resource[Any]]]:
    # Recursion depth is bounded by the schema depth limit checked before the scan.
    yield resolver, resource
    for sub in resource.subresources():
        yield from _walk(resolver.in_subresource(sub), sub)


def _check_ref(resolver: Resolver[Any], keyword: str, ref: str) -> None:
    shown = ref if len(ref) <= _MAX_REF_CHARS else ref[:_MAX_REF_CHARS] + "..."
    try:
        resolver.lookup(ref)
    except (PointerToNowhere, NoSuchAnchor) as exc:
        raise UnsafeSchema(f"{keyword} {shown!r} points to nothing in the schema") from exc
    except Unresolvable as exc:
        raise UnsafeSchema(f"{keyword} {shown!r} is not local to the schema (remote and file references are "
                           "never fetched)") from exc


def _compile_into(patterns: dict[str, Any], pattern: str) -> None:
    if pattern in patterns:
        return
    try:
        patterns[pattern] = compile_pattern(pattern)
    except UnsupportedPattern as exc:
        raise UnsafeSchema(f"pattern {describe(pattern)} is not supported by the linear-time regex engine "
                           "(backreferences and lookaround are not allowed)") from exc


def _mentions_any(value: Any, keys: frozenset[str]) -> bool:
    """Whether any of ``keys`` appears as a mapping key anywhere in ``value`` (a safe over-approximation)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if not keys.isdisjoint(item):
                return True
            stack.extend(item.values())
        elif isinstance(item, Mapping):
            if any(key in item for key in keys):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _mentions(value: Any, key: str) -> bool:
    """Whether ``key`` appears as a mapping key anywhere in ``value`` (a safe over-approximation)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if key in item:
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
