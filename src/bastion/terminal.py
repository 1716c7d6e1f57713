"""Text for a terminal: the one encoder for every string bastion prints that it did not write itself.

Tool names, annotation keys, descriptions, rule ids, principal ids, arguments, error texts from Redis or a policy
file: any of them may hold an ESC sequence, a C1 control, a bidirectional override or a newline. Printed raw on
an operator's terminal, they recolour, conceal or rewrite the lines around them (a changed description drawn
black on black under ``bastion pins diff``), or forge lines that look like bastion's own. Escaping at each print
site misses the next one, so the escaping is done here, once, at two levels:

- **Fields** (``printable``): every character ``str.isprintable`` refuses (C0 and C1 controls, DEL, format
  characters such as bidirectional overrides and zero-width characters, line and paragraph separators, lone
  surrogates, unassigned code points) is written as its ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN`` escape, as
  ``repr`` writes it; newlines and tabs too, so a value stays on its own line and cannot forge the next one.
  Printable text (accents, CJK, emoji) is kept as is.
- **Streams** (``TerminalText`` / ``stdio``): the CLI's ``sys.stdout`` and ``sys.stderr`` are wrapped so that
  whatever reaches them is escaped the same way except ``\\n``, the one character a command writes for
  structure. A print site that forgets to escape a field can at worst let a value break a line; no escape
  sequence reaches the terminal.
- **JSON** (``json_text``): JSON output keeps its meaning: what it would hold raw is written as JSON's own
  ``\\uXXXX`` escape instead, so ``--json`` output stays valid JSON and passes the stream unchanged.

Floor-level: no bastion imports, so the log renderer (``bastion.logs``) and every CLI module can use it.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["TerminalText", "json_text", "printable", "printable_json", "printable_lines", "raw_stdio", "stdio"]


def printable(text: str) -> str:
    """``text`` with every non-printable character (``str.isprintable``: controls, newlines and tabs, format
    characters such as bidirectional overrides, separators other than the space) written as its
    ``\\xNN``/``\\uNNNN``/``\\UNNNNNNNN`` escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def printable_lines(text: str) -> str:
    """``text`` escaped as ``printable`` does, except ``\\n``: lines stay lines."""
    if text.isprintable():
        return text
    return "\n".join(printable(line) for line in text.split("\n"))


def json_text(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """``value`` as JSON text with nothing a terminal acts on: printable characters (non-ASCII ones too) as they
    are, every other one as a JSON ``\\uXXXX`` escape (a surrogate pair beyond the BMP), so it parses to the same
    value. Structural newlines of ``indent`` are kept."""
    return printable_json(json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys))


def printable_json(text: str) -> str:
    """JSON ``text`` with every non-printable character but ``\\n`` written as its JSON ``\\uXXXX`` escape: the
    same JSON value, since outside strings JSON holds no such character but whitespace (``indent``'s newlines
    are kept; a tab or carriage return between tokens would become an invalid escape, and JSON from
    ``json.dumps`` has none)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\n" else _json_escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _json_escape(c: str) -> str:
    code = ord(c)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


class TerminalText(io.TextIOBase):
    """A text stream that writes ``printable_lines(text)`` to the stream it wraps: the CLI's output boundary.

    Everything else (``fileno``, ``isatty``, ``encoding``, flushing) is the wrapped stream's, so code that asks
    for the descriptor still gets it (and then writes bytes of its own, not through this class).
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable_lines(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8") or "utf-8"

    @property
    def wrapped(self) -> TextIO:
        return self._stream


@contextmanager
def stdio() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` through ``TerminalText`` for the duration, restored after."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = TerminalText(out), TerminalText(err)
    try:
        yield
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            sys.stdout, sys.stderr = out, err


@contextmanager
def raw_stdio() -> Iterator[None]:
    """The streams ``stdio`` wrapped, for a command whose output is not for a terminal (``serve``: its log lines
    are escaped by their renderer, its audit records are JSON)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout = out.wrapped if isinstance(out, TerminalText) else out
    sys.stderr = err.wrapped if isinstance(err, TerminalText) else err
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
