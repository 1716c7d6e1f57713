"""Regular expressions from untrusted schemas, on a linear-time engine.

Python's ``re`` backtracks, so a pattern such as ``^(a+)+$`` takes exponential time on a crafted input. RE2 runs in
time linear in the input, at the price of refusing the constructs that need backtracking (backreferences,
lookaround). A schema using those is quarantined rather than checked by ``re``.

RE2 matches UTF-8, and a JSON string may hold a lone surrogate (bastion's parser keeps them, so that the
sanitizer sees what was sent), which UTF-8 cannot encode. Such a string is matched with each lone surrogate read
as U+FFFD, the replacement character: a pattern that admits any character (``.``) still matches it, one that
lists what it admits does not.
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


class Pattern:
    """A compiled pattern; ``search`` takes any string, lone surrogates included (see the module's note)."""

    __slots__ = ("_re",)

    def __init__(self, compiled: Any) -> None:
        self._re = compiled

    def search(self, text: str) -> Any:
        try:
            return self._re.search(text)
        except UnicodeEncodeError:
            return self._re.search(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))


def compile_pattern(pattern: str) -> Pattern:
    """Compile an ECMA-262-style schema pattern with RE2, or raise ``UnsupportedPattern``."""
    try:
        return Pattern(re2.compile(pattern, _options()))
    except re2.error as exc:
        raise UnsupportedPattern(pattern) from exc
    except UnicodeEncodeError as exc:  # a lone surrogate in the pattern itself
        raise UnsupportedPattern(pattern) from exc


def describe(pattern: str) -> str:
    """The pattern as it may appear in a reason: quoted and shortened."""
    shown = pattern if len(pattern) <= _MAX_REASON_PATTERN_CHARS else pattern[:_MAX_REASON_PATTERN_CHARS] + "..."
    return repr(shown)
