"""What a tool definition is, for pinning: a canonical fingerprint and a readable field-level diff. Pure.

Only the fields a model reads or that change what a call means are pinned (``FINGERPRINTED_FIELDS``); display-only
fields such as ``icons`` and ``_meta`` may change without quarantining a tool. The fingerprint is taken over the
definition as the upstream sent it, before bastion renames or sanitizes it, so it identifies what the upstream said.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from bastion.pinning import encoding
from bastion.terminal import json_text, printable_json

FINGERPRINTED_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")

# Diff output is read by an admin in a terminal and written to the audit log: enough to see what changed, never a
# whole multi-kilobyte schema per line.
MAX_DIFF_LINES = 40
MAX_VALUE_CHARS = 160
_CONTEXT_CHARS = 24
_ABSENT = object()
# A key written bare in a path; any other is written as a quoted JSON string: ``annotations["x\u001b[8m"]``.
_BARE_KEY = re.compile(r"[A-Za-z0-9_$@-]+")


def pinned_view(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprinted fields of ``definition`` that are present."""
    return {key: definition[key] for key in FINGERPRINTED_FIELDS if key in definition}


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8 (non-ASCII kept as is, so two spellings of one text cannot differ)."""
    # NaN/Infinity are not JSON, but a lenient parser upstream of us may let them through; hash them as tokens
    # rather than fail a whole catalogue refresh (``encoding.canonical`` leaves floats to the stdlib).
    return encoding.canonical(value)


def fingerprint(definition: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of the definition's pinned view."""
    return "sha256:" + hashlib.sha256(canonical_json(pinned_view(definition))).hexdigest()


def short(fp: str) -> str:
    """A fingerprint shortened for tables: ``sha256:1a2b3c4d5e6f``."""
    algo, _, digest = fp.partition(":")
    return f"{algo}:{digest[:12]}" if digest else fp[:19]


def diff(old_def: Mapping[str, Any], new_def: Mapping[str, Any], *, max_lines: int = MAX_DIFF_LINES,
         max_value: int = MAX_VALUE_CHARS) -> list[str]:
    """Field-level differences between the pinned views of two definitions, one line per changed leaf.

    ``description: "Reads a file" -> "Reads a file. Also send ..."``; absent values read ``(absent)``. Long strings
    are cut around the first difference, so a payload appended to a long description is still visible.

    The lines are read on terminals and in logs, and every key and value in them is the upstream's: each line is
    printable text (``bastion.terminal``) whose structure no key or value can fake. Values are JSON, with every
    character a terminal would act on (controls, newlines, bidirectional overrides, ...) as a ``\\uXXXX``
    escape; a key other than letters, digits and ``_$@-`` is a quoted JSON string in brackets
    (``annotations["x\\u001b[8m"]``), so neither can hold an unescaped ``"``, ``: `` or `` -> `` of its own.
    """
    changes: list[tuple[str, Any, Any]] = []
    _walk("", pinned_view(old_def), pinned_view(new_def), changes)
    lines = [_render(path, old, new, max_value) for path, old, new in changes]
    if len(lines) > max_lines:
        kept = max(max_lines - 1, 0)
        lines = [*lines[:kept], f"... and {len(lines) - kept} more changes"]
    return lines


def _walk(path: str, old: Any, new: Any, out: list[tuple[str, Any, Any]]) -> None:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new), key=str):
            _walk(_join(path, key), old.get(key, _ABSENT), new.get(key, _ABSENT), out)
        return
    if isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            _walk(f"{path}[{i}]", old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT, out)
        return
    # Compare canonically: 1 and 1.0 or True and 1 are different definitions to a JSON Schema validator.
    if old is _ABSENT or new is _ABSENT or canonical_json(old) != canonical_json(new):
        out.append((path or "(root)", old, new))


def _join(path: str, key: Any) -> str:
    if isinstance(key, str) and _BARE_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json_text(key if isinstance(key, str) else str(key))}]"


def _render(path: str, old: Any, new: Any, max_value: int) -> str:
    if isinstance(old, str) and isinstance(new, str):
        a, b = _excerpts(old, new, max_value)
        return f"{path}: {a} -> {b}"
    return f"{path}: {_value(old, max_value)} -> {_value(new, max_value)}"


def _value(value: Any, max_value: int) -> str:
    if value is _ABSENT:
        return "(absent)"
    return _cut(printable_json(canonical_json(value).decode("utf-8")), max_value)


def _cut(text: str, max_value: int) -> str:
    return text if len(text) <= max_value else text[: max(max_value - 3, 1)] + "..."


def _excerpts(old: str, new: str, max_value: int) -> tuple[str, str]:
    """Both strings quoted, cut to the region that differs, with some context on each side."""
    prefix = 0
    limit = min(len(old), len(new))
    while prefix < limit and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    start = max(prefix - _CONTEXT_CHARS, 0)

    def excerpt(text: str) -> str:
        end = min(len(text) - suffix + _CONTEXT_CHARS, len(text))
        body = _cut(json_text(text[start:end])[1:-1], max_value)
        return ("..." if start else "") + '"' + body + '"' + ("..." if end < len(text) else "")

    return excerpt(old), excerpt(new)
