"""How much validation may cost: bounds on schemas and on the values checked against them.

Pure code. ``measure`` walks a JSON value iteratively and stops as soon as a bound is crossed, so measuring a
hostile value costs no more than the bound itself, and no deep value can exhaust the Python stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """Bounds that keep one hostile upstream from stalling the gateway.

    Sizes are approximate JSON sizes in bytes; depths count nested containers (``{}`` is 1, ``{"a": []}`` is 2).
    ``max_validation_steps`` bounds keyword evaluations per validation, which is what composition and recursive
    ``$ref`` blow-ups spend.
    """

    max_schema_bytes: int = 256 * KIB
    max_schema_depth: int = 32
    max_argument_bytes: int = 1 * MIB
    max_argument_depth: int = 64
    max_output_bytes: int = 4 * MIB
    max_output_depth: int = 64
    max_errors: int = 10
    max_validation_steps: int = 100_000


@dataclass(frozen=True, slots=True)
class Excess:
    """Which bound a value crossed, and the bound's value."""

    kind: Literal["bytes", "depth"]
    limit: int


# Sizes of the scalars as JSON text; close enough to bound work, which is all the size is used for.
_NULL_BYTES = 4
_FLOAT_BYTES = 24


def measure(value: Any, *, max_bytes: int, max_depth: int) -> Excess | None:
    """Return the first bound ``value`` crosses, or None when it fits."""
    found = json_size(value, max_bytes=max_bytes, max_depth=max_depth)
    return found if isinstance(found, Excess) else None


def json_size(value: Any, *, max_bytes: int, max_depth: int) -> int | Excess:
    """The approximate JSON size of ``value`` in bytes, or the first bound it crosses (at no more cost than the
    bound itself)."""
    size = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        # Exact types first: parsed JSON is plain dicts, lists and scalars, and an ABC isinstance check costs
        # several times a type comparison (this runs on every call's arguments and every catalogue schema).
        kind = type(item)
        if kind is str:
            size += len(item) + 2 if item.isascii() else len(item.encode("utf-8", "surrogatepass")) + 2
        elif kind is dict or (kind is not list and kind is not tuple and isinstance(item, Mapping)):
            depth += 1
            if depth > max_depth:
                return Excess("depth", max_depth)
            size += 2 + len(item)
            for key, child in item.items():
                if type(key) is str:
                    size += (len(key) + 2 if key.isascii() else len(key.encode("utf-8", "surrogatepass")) + 2) + 1
                else:
                    size += _string_bytes(key) + 1 if isinstance(key, str) else _FLOAT_BYTES
                push((child, depth))
        elif kind is list or kind is tuple or isinstance(item, list | tuple):
            depth += 1
            if depth > max_depth:
                return Excess("depth", max_depth)
            size += 2 + len(item)
            stack.extend((child, depth) for child in item)
        elif isinstance(item, str):
            size += _string_bytes(item)
        elif isinstance(item, bool) or item is None:
            size += _NULL_BYTES
        elif isinstance(item, int):
            # bit_length, not str(): converting a huge int to text is quadratic.
            size += item.bit_length() // 3 + 2
        else:
            size += _FLOAT_BYTES
        if size > max_bytes:
            return Excess("bytes", max_bytes)
    return size


def _string_bytes(text: str) -> int:
    return len(text) + 2 if text.isascii() else len(text.encode("utf-8", "surrogatepass")) + 2
