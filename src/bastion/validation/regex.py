"""Regular expressions from untrusted schemas, on a linear-time engine.

Python's ``re`` backtracks, so a pattern such as ``^(a+)+$`` takes exponential time on a crafted input. RE2 runs in
time linear in the input, at the price of refusing the constructs that need backtracking (backreferences,
lookaround). A schema using those is quarantined rather than checked by ``re``.
"""

from __future__ import annotations

from typing import Any

import re2

# Bound the memory a single compiled pattern may take; RE2 reports a compile error past it.
_MAX_PATTERN_MEMORY = 8 * 1024 * 1024
_MAX_REASON_PATTERN_CHARS = 60


class UnsupportedPattern(Exception):
    """RE2 cannot compile the pattern. Internal: mapped to ``SchemaRejected`` or a violation by the callers."""


def _options() -> Any:
    options = re2.Options()
    # RE2 writes parse failures to stderr by default; they are reported through bastion's own logs instead.
    options.log_errors = False
    options.max_mem = _MAX_PATTERN_MEMORY
    return options


def compile_pattern(pattern: str) -> Any:
    """Compile an ECMA-262-style schema pattern with RE2, or raise ``UnsupportedPattern``."""
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        raise UnsupportedPattern(pattern) from exc


def describe(pattern: str) -> str:
    """The pattern as it may appear in a reason: quoted and shortened."""
    shown = pattern if len(pattern) <= _MAX_REASON_PATTERN_CHARS else pattern[:_MAX_REASON_PATTERN_CHARS] + "..."
    return repr(shown)
