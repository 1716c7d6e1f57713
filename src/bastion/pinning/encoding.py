"""The stdlib's JSON encodings that pins are written and fingerprinted in, at orjson's speed where it is exact.

Fingerprints are stored (in pin files and Redis) and compared across versions, so their bytes can never change;
the pin file is written in ``json.dumps(..., indent=2, sort_keys=True, ensure_ascii=False)`` layout. The stdlib
encodes a tool definition in tens of microseconds, and with ``indent`` in pure Python in hundreds; orjson does
either in a few. Both write the same bytes for the same value as long as the value holds only exact ``dict``
(string keys), ``list``, ``str``, ``int`` within 64 bits, ``bool`` and ``None``: same escapes (``"``, ``\\``, the
C0 controls, nothing else with ``ensure_ascii=False``), same key order, same layout. Floats are where they part
(``1e-05`` against ``0.00001``), so a value holding any float, or anything else, takes the stdlib path. The tests
hold the two paths to byte equality.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


def orjson_exact(value: Any) -> bool:
    """Whether orjson encodes ``value`` exactly as the stdlib does (see the module docstring)."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            extend(item.values())
        elif kind is list:
            extend(item)
        elif kind is int:
            if not _INT_MIN <= item <= _INT_MAX:
                return False
        else:
            return False  # float, tuple, a subclass, anything else: only the stdlib knows its spelling
    return True


def canonical(value: Any) -> bytes:
    """``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")``."""
    if orjson_exact(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass  # a lone surrogate: the stdlib path fails on it in its own way, as it always did
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def indented(value: Any) -> str:
    """``json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)``."""
    if orjson_exact(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2).decode("utf-8")
        except orjson.JSONEncodeError:
            pass
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
