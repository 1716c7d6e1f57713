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


def relax_anchors(pattern: str) -> str:
    """``pattern`` with every text anchor (``^``, ``$``, ``\\A``, ``\\z``, in or out of ``(?m)``) replaced by an
    empty group.

    Taking an assertion out can only let a pattern match more, so the result matches wherever ``pattern`` does.
    Prescans need this: they search many strings joined into one text, where a string's start is no longer the
    text's start. ``^``/``$`` inside a character class and escaped ones (``\\^``, ``\\$``, ``\\Q...\\E``) are
    literals and stay. Word boundaries need nothing: the separators are non-word characters, as a text's edges are.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1:i + 2]
            if nxt in ("A", "z"):
                out.append("(?:)")
                i += 2
            elif nxt == "Q":
                end = pattern.find("\\E", i + 2)
                end = n if end < 0 else end + 2
                out.append(pattern[i:end])
                i = end
            else:
                out.append(pattern[i:i + 2])
                i += 2
        elif c == "[":
            end = _class_end(pattern, i)
            out.append(pattern[i:end])
            i = end
        elif c in "^$":
            out.append("(?:)")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """The index just past the character class opening at ``start`` (RE2 syntax: a leading ``^`` negates, a
    ``]`` right after the opening is a literal, ``[:alpha:]`` names a class, a backslash escapes)."""
    n = len(pattern)
    j = start + 1
    if pattern[j:j + 1] == "^":
        j += 1
    if pattern[j:j + 1] == "]":
        j += 1
    while j < n:
        c = pattern[j]
        if c == "\\":
            j += 2
        elif c == "[" and pattern[j + 1:j + 2] == ":" and (close := pattern.find(":]", j + 2)) >= 0:
            j = close + 2
        elif c == "]":
            return j + 1
        else:
            j += 1
    return n


@dataclass(frozen=True, slots=True)
class Hit:
    index: int  # which pattern, in the order given
    start: int  # span to replace: the pattern's named group when it has one, else the whole match
    end: int


class PatternSet:
    """Immutable after construction; safe to share between concurrent calls."""

    __slots__ = ("_fallback", "_joined", "_progs", "_set", "_set_to_index", "_slots")

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
        # The set ``may_match_joined`` runs: the same patterns with their anchors relaxed (most have none).
        self._joined: Any | None = self._set
        relaxed = [relax_anchors(patterns[i]) for i in self._set_to_index]
        if relaxed != [patterns[i] for i in self._set_to_index]:
            joined = re2.Set.SearchSet(_options())
            try:
                for pattern in relaxed:
                    joined.Add(pattern)
                joined.Compile()
            except re2.error:
                joined = None  # cannot happen for a pattern RE2 took; if it did, every joined text may match
            self._joined = joined

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

    def candidates_relaxed(self, text: str) -> list[int]:
        """``candidates`` with anchors relaxed (``relax_anchors``): a superset of the patterns that match in
        ``text`` or in any slice of it standing alone, provided the characters around the slice are not word
        characters. (RE2 has no lookaround: only anchors, relaxed here, and word boundaries, which such a
        neighbour satisfies as an edge does, look past a match.) ``Redactor.redact`` runs this one pass for a
        JSON member and for the value and key inside it.
        """
        if self._set is not None and self._joined is None:
            return list(range(len(self._progs)))
        found: list[int] = []
        if self._joined is not None:
            matched = self._joined.Match(text)
            if matched:
                found.extend(self._set_to_index[j] for j in matched)
        found.extend(self._fallback)
        return sorted(found)

    def may_match(self, text: str) -> bool:
        """False only if no pattern can match anywhere in ``text`` (one RE2 pass)."""
        return bool(self._fallback) or (self._set is not None and bool(self._set.Match(text)))

    def may_match_joined(self, text: str) -> bool:
        """``may_match`` for many strings joined by separators that begin and end with ``\\n`` and hold no word
        character: False only if no pattern can match anywhere in any of the strings on its own.

        A match inside one string is a match inside the joined text, except where it needs that string's edges:
        word boundaries and ``(?m)`` anchors see the separator as they saw the edge, and the other anchors are
        relaxed (``relax_anchors``). A match spanning two strings is a false positive, which only costs the
        per-string passes.
        """
        if self._fallback or (self._set is not None and self._joined is None):
            return True
        return self._joined is not None and bool(self._joined.Match(text))

    def hits(self, text: str, accept: Callable[[Hit], bool] | None = None,
             candidates: list[int] | None = None) -> list[Hit]:
        """Non-overlapping accepted hits: leftmost span first, then longest, then the earlier pattern.

        ``accept`` filters before overlaps are resolved, so a rejected generic match never hides a specific one.
        ``candidates``: the patterns to run, when the caller already knows a superset of those that occur.
        """
        raw: list[Hit] = []
        for i in self.candidates(text) if candidates is None else candidates:
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
