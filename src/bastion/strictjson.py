"""Strict JSON for the front door: one parse per body, and the flaws JSON-RPC peers cannot take, located.

A body can be valid JSON and still unfit to pass through a gateway. bastion refuses three such things, because
the parties behind it would read them differently or not at all:

- nesting deeper than ``max_depth``: every recursive consumer downstream (schema validators, the audit digest,
  upstream parsers) has a limit of its own, and the first one to hit it fails in its own way;
- integers outside the JSON-safe range ``±(2^53-1)``: JavaScript peers round them, so the policy would judge
  one number and the upstream act on another (and beyond 64 bits orjson itself reads them as floats);
- lone UTF-16 surrogates (``"\\ud800"``) and numbers too large for a double: not representable in UTF-8 or
  IEEE 754, so the message could be neither forwarded nor recorded as sent.

None of these is a parse error: the document is read, the flaw is located (``Flaw.path``), and the JSON-RPC
layer answers ``-32600``/``-32602`` with the request's id. Only bytes that are not JSON at all are ``-32700``.

Cost: orjson parses every body. The slower checks run only when a cheap scan says they could find something:
the depth walk when the body has more brackets than the limit, the exact-number reparse (stdlib ``json``, which
keeps big integers exact) when a number of 16 or more digits appears in value position.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

MAX_SAFE_INTEGER = 2**53 - 1
DEFAULT_MAX_DEPTH = 64
# Deeper than orjson reads at all; configured limits stay well below it, and below the stdlib parser's
# recursion limit, so the exact-number reparse never recurses out.
MAX_CONFIGURABLE_DEPTH = 512

# A number of 16 digits or more (2^53 has 16) where a value can start: after '[', ':' or ',', past whitespace
# and a sign. Found with one C-speed translate (digits to '0', value starts to 'S', whitespace and '-' dropped,
# everything else to 'x') and a substring search. A superset: such text inside a string only costs the exact scan.
_NUMBER_TABLE = bytes((0x30 if chr(b).isdigit() and b < 0x80 else 0x53 if b in b"[:," else 0x78) for b in range(256))
_NUMBER_DROP = b" \t\r\n-"
_LONG_NUMBER = b"S" + b"0" * 16
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Flaw:
    """What is wrong, and where: ``path`` is the key/index path from the message object."""

    path: tuple[str | int, ...]
    problem: str

    def where(self) -> str:
        """``params.arguments.a[3]``: the path as a reader writes it (keys shortened and made printable)."""
        out = ""
        long = len(self.path) > 8
        for index, part in enumerate(self.path[:4] + self.path[-2:] if long else self.path):
            if long and index == 4:
                out += f"…({len(self.path) - 6} more)…"
            if isinstance(part, int):
                out += f"[{part}]"
            else:
                key = printable(part)[:64]
                out += f".{key}" if out else key
        return out or "(top level)"


class NotJson(ValueError):
    """The body is not JSON text (or not UTF-8): a parse error. ``detail`` is for the log."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class TooDeepToRead(ValueError):
    """Nested deeper than any parser here reads, and too large to cut down to size: the message cannot be read."""


class Document(NamedTuple):
    """A parsed body. ``exact`` means numbers and strings were read by the exact parser and must be scanned
    for unrepresentable values; ``bracketed`` means the body has enough brackets to be too deep. (A named tuple,
    not a dataclass: it is built once per request, and a frozen dataclass costs several times more to build.)"""

    value: Any
    max_depth: int
    exact: bool = False
    bracketed: bool = False
    # The body was nested past what the parsers read; what lies below the limit was cut and replaced by a marker,
    # so the envelope (id, method, tool name) can still be read, answered and audited.
    cut: bool = False

    def flaw(self, item: Any) -> Flaw | None:
        """The first flaw of one message (the whole document, or one element of a batch), or None."""
        if self.cut:
            where = _marker_path(item)
            if where is not None:
                return Flaw(where, f"nesting deeper than {self.max_depth} levels")
        if not (self.exact or self.bracketed):
            return None
        return first_flaw(item, self.max_depth, scalars=self.exact)


def decode(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Document:
    """Parse ``body``. Raises ``NotJson`` for bytes that are not JSON, and ``TooDeepToRead`` for a body nested past
    the parsers' limits that is also too large to cut down (``MAX_CUT_TOKENS``)."""
    try:
        return _decode(body, max_depth)
    except TooDeepToRead:
        # A batch's messages sit one level down: cut each of them at the limit, not the array.
        keep = max_depth + (1 if body.lstrip()[:1] == b"[" else 0)
        shallow = _cut(body, keep)
        if shallow is None:
            raise
        return _decode(shallow, max_depth)._replace(cut=True)


def _decode(body: bytes, max_depth: int) -> Document:
    bracketed = body.count(b"[") + body.count(b"{") > max_depth
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise TooDeepToRead(str(exc)) from None
        # Lone surrogates and doubles that overflow are valid JSON orjson will not build: read them exactly.
        return Document(_exact(body, str(exc)), max_depth, exact=True, bracketed=bracketed)
    if _LONG_NUMBER in body.translate(_NUMBER_TABLE, _NUMBER_DROP):
        try:
            return Document(_exact(body, "unreachable"), max_depth, exact=True, bracketed=bracketed)
        except (NotJson, TooDeepToRead):
            pass  # deeper than the exact parser reads: the depth walk below refuses it anyway
    return Document(value, max_depth, bracketed=bracketed)


def first_flaw(value: Any, max_depth: int, *, scalars: bool = True) -> Flaw | None:
    """The first flaw in ``value`` (depth-first, in document order), or None. Iterative: never recurses."""
    if not scalars and not _too_deep(value, max_depth):
        return None  # the common case, answered by the lean walk below; paths are only built for a flaw
    if _container(value):
        stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 1, ())]
    else:
        return _scalar_flaw(value, ()) if scalars else None
    if max_depth < 1:
        return Flaw((), f"nesting deeper than {max_depth} levels")
    while stack:
        node, depth, path = stack.pop()
        children: list[tuple[Any, int, tuple[str | int, ...]]] = []
        for key, child in _items(node):
            where = (*path, key)
            if scalars and isinstance(key, str) and not _encodable(key):
                return Flaw(where, "an object key with a lone UTF-16 surrogate")
            if _container(child):
                if depth + 1 > max_depth:
                    return Flaw(where, f"nesting deeper than {max_depth} levels")
                children.append((child, depth + 1, where))
            elif scalars:
                found = _scalar_flaw(child, where)
                if found is not None:
                    return found
        stack.extend(reversed(children))
    return None


# Tokens that matter for nesting: strings (skipped whole, brackets inside them are text) and brackets.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')
_MARKER = "\x00bastion: nested too deeply\x00"
_MARKER_JSON = b'"\\u0000bastion: nested too deeply\\u0000"'
# Cutting walks the body's tokens in Python: bounded, so a huge hostile body costs milliseconds, not seconds.
MAX_CUT_TOKENS = 20_000


def _cut(body: bytes, keep: int) -> bytes | None:
    """``body`` with every container below depth ``keep`` replaced by a marker string; None past the budget."""
    out: list[bytes] = []
    last = depth = 0
    start: int | None = None
    for count, token in enumerate(_TOKEN.finditer(body)):
        if count >= MAX_CUT_TOKENS:
            return None
        first = body[token.start()]
        if first == 0x22:  # '"': a string
            continue
        if first in b"[{":
            depth += 1
            if depth == keep + 1:
                start = token.start()
        else:
            if depth == keep + 1 and start is not None:
                out += (body[last:start], _MARKER_JSON)
                last, start = token.end(), None
            depth -= 1
    out.append(body[last:])
    return b"".join(out)


def _marker_path(value: Any) -> tuple[str | int, ...] | None:
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if node == _MARKER:
            return path
        if _container(node):
            stack.extend(reversed([(child, (*path, key)) for key, child in _items(node)]))
    return None


def _too_deep(value: Any, max_depth: int) -> bool:
    """Whether any container sits deeper than ``max_depth``: level by level, containers only, no paths (the
    tight comprehension is what keeps a 3 MB body's check well under its parse time)."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 1
    while level:
        level = [child for node in level for child in (node.values() if type(node) is dict else node)
                 if type(child) is dict or type(child) is list]
        if level and depth >= max_depth:
            return True
        depth += 1
    return False


def printable(text: str) -> str:
    """``text`` with lone surrogates replaced, so it can be encoded, logged and echoed."""
    return text if _encodable(text) else _SURROGATE.sub("\ufffd", text)


def _exact(body: bytes, orjson_detail: str) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotJson(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        return json.loads(text, parse_int=_int, parse_constant=_constant)
    except RecursionError:
        raise TooDeepToRead("nesting too deep for the exact parser") from None
    except ValueError as exc:
        raise NotJson(f"{orjson_detail} ({exc})") from None


def _int(literal: str) -> int:
    # Python refuses to convert more than 4300 digits; such a literal is out of range whatever its value.
    if len(literal) > 4000:
        return -_HUGE if literal.startswith("-") else _HUGE
    return int(literal)


_HUGE = MAX_SAFE_INTEGER + 1


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _container(value: Any) -> bool:
    return isinstance(value, dict | list)


def _items(node: Any) -> Iterator[tuple[str | int, Any]]:
    if isinstance(node, dict):
        return iter(node.items())
    return enumerate(node)


def _scalar_flaw(value: Any, path: tuple[str | int, ...]) -> Flaw | None:
    if isinstance(value, str):
        return None if _encodable(value) else Flaw(path, "a string with a lone UTF-16 surrogate")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return None
        return Flaw(path, "an integer outside the JSON-safe range ±(2^53-1)")
    if isinstance(value, float) and not math.isfinite(value):
        return Flaw(path, "a number too large for a double")
    return None


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
