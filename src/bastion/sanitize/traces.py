"""Reduce a stack trace in an upstream's error text to the one line that says what went wrong. Pure.

A trace tells an attacker (and a model) file paths, library versions and code structure of the upstream; the
client needs the message. Recognised: Python tracebacks (the final ``Type: message`` line is kept), and the
``at …`` frames of JavaScript, Java and .NET, Go's ``goroutine N [running]:`` dumps and Rust/Python ``File …``
frames (the first line, the message, is kept). Text that is not a trace is returned unchanged.
"""

from __future__ import annotations

import re

_PY_HEAD = "Traceback (most recent call last):"
_FRAME = re.compile(r"^\s+(?:at\s+\S|File\s+\"|\d+:\s+0x[0-9a-f]+|[\w./-]+\.(?:go|rs|py|js|ts|java|cs):\d+)",
                    re.MULTILINE)
_GOROUTINE = re.compile(r"^goroutine\s+\d+\s+\[", re.MULTILINE)
MARK = " [bastion: stack trace removed]"


def one_line(text: str) -> str | None:
    """The message of a stack trace in ``text``, or None when ``text`` holds none."""
    if "\n" not in text:
        return None
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    if _PY_HEAD in text:
        # Python prints the exception last; chained tracebacks end with the one that escaped.
        tail = [line for line in lines if not line.startswith((" ", "\t")) and line != _PY_HEAD
                and not line.startswith(("During handling", "The above exception"))]
        return (tail[-1].strip() if tail else "error") + MARK
    if _GOROUTINE.search(text) or len(_FRAME.findall(text)) >= 2:
        head = next((line for line in lines if not _FRAME.match(line) and not _GOROUTINE.match(line)), "error")
        return head.strip() + MARK
    return None
