"""Many regexes, one pass: an RE2 set says which patterns occur, and only those are run to find the spans.

RE2 matches in linear time, so neither the rule pack nor an admin's rule can be turned into a ReDoS by a
hostile result. A pattern RE2 cannot compile (lookaround, backreferences) falls back to Python's ``re`` and runs
as an extra pass on every text; ``SanitizeConfig`` logs that at load time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import re2

from bastion.errors import ConfigError


def _options() -> Any:
    opts = re2.Options()
    opts.log_errors = False  # a failed compile is reported as ConfigError, not written to stderr by the C++ side
    return opts


def try_re2(pattern: str) -> Any | None:
    """The RE2 program for ``pattern``, or None if RE2 does not support its syntax."""
    try:
        return re2.compile(pattern, _options())
    except re2.error:
        return None


def compile_any(pattern: str, path: str) -> Any:
    """RE2 if possible, else ``re``; a pattern neither accepts is a ConfigError at ``path``."""
    prog = try_re2(pattern)
    if prog is not None:
        return prog
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"invalid regular expression: {exc}", path=path) from None


@dataclass(frozen=True, slots=True)
class Hit:
    index: int  # which pattern, in the order given
    start: int  # span to replace: the pattern's named group when it has one, else the whole match
    end: int


class PatternSet:
    """Immutable after construction; safe to share between concurrent calls."""

    __slots__ = ("_fallback", "_progs", "_set", "_set_to_index", "_slots")

    def __init__(self, patterns: Sequence[str], *, group: str = "secret", path: str = "patterns") -> None:
        self._progs: list[Any] = []
        self._slots: list[int | None] = []
        self._fallback: list[int] = []
        self._set_to_index: list[int] = []  # RE2 set member -> pattern index
        self._set: Any | None = None
        rset = re2.Set.SearchSet(_options())
        for i, pattern in enumerate(patterns):
            prog = compile_any(pattern, f"{path}[{i}]")
            self._progs.append(prog)
            self._slots.append(prog.groupindex.get(group))
            if isinstance(prog, re.Pattern):
                self._fallback.append(i)
            else:
                rset.Add(pattern)
                self._set_to_index.append(i)
        if self._set_to_index:
            rset.Compile()
            self._set = rset

    @property
    def fallback_count(self) -> int:
        return len(self._fallback)

    def candidates(self, text: str) -> list[int]:
        found: list[int] = []
        if self._set is not None:
            matched = self._set.Match(text)
            if matched:
                found.extend(self._set_to_index[j] for j in matched)
        found.extend(self._fallback)
        return sorted(found)

    def may_match(self, text: str) -> bool:
        """False only if no pattern can match anywhere in ``text`` (one RE2 pass)."""
        return bool(self._fallback) or (self._set is not None and bool(self._set.Match(text)))

    def hits(self, text: str, accept: Callable[[Hit], bool] | None = None) -> list[Hit]:
        """Non-overlapping accepted hits: leftmost span first, then longest, then the earlier pattern.

        ``accept`` filters before overlaps are resolved, so a rejected generic match never hides a specific one.
        """
        raw: list[Hit] = []
        for i in self.candidates(text):
            prog, slot = self._progs[i], self._slots[i]
            for m in prog.finditer(text):
                start, end = m.span(slot) if slot is not None else m.span()
                if start < 0 or end <= start:
                    continue
                hit = Hit(i, start, end)
                if accept is None or accept(hit):
                    raw.append(hit)
        if len(raw) <= 1:
            return raw
        return non_overlapping(raw)


def non_overlapping(raw: list[Hit]) -> list[Hit]:
    """Leftmost hits first, the longest at each position, none overlapping a hit already kept."""
    raw.sort(key=lambda h: (h.start, h.start - h.end, h.index))
    kept: list[Hit] = []
    last_end = -1
    for h in raw:
        if h.start >= last_end:
            kept.append(h)
            last_end = h.end
    return kept
