"""The pass every string bastion sanitizes goes through: clean, redact, scan for injection, then truncate.

``StringSanitizer`` is all a walk over an arbitrary shape needs (``walk.Walker`` calls it for every string it
visits); ``result.Sanitizer`` adds the passes over results, content blocks and free JSON on top. Kept apart so that
the walker and the result passes, which use each other, both stand on this one.
"""

from __future__ import annotations

from typing import Any

from bastion.sanitize.config import EffectiveSanitizePolicy
from bastion.sanitize.report import SanitizeReport
from bastion.sanitize.secrets import members_text
from bastion.sanitize.text import clean_text, needs_cleaning

__all__ = ["MAX_DEPTH", "SCAN_MARGIN", "StringSanitizer", "truncate_utf8", "truncation_marker", "window"]

MAX_DEPTH = 64
# How far past the cut (``max_item_bytes`` or a string's own limit) a string is scanned. Work is bounded by what can
# leave, not by what an upstream sends (a 60 MB text held the loop seconds when it was scanned whole), and this
# margin is what keeps a cut from splitting a secret the redactor did not see whole: a secret that starts before the
# cut and ends within the margin is redacted whole. One that runs on past the margin is caught by its beginning:
# the open-ended rules (private key blocks without their END line, tokens of unbounded length) match a prefix.
SCAN_MARGIN = 64 * 1024
# Between the strings a prescan joins: line breaks, so that word boundaries and (?m) anchors see a string's edges
# as they would alone, around a NUL, which no secret rule or injection pattern lets a match cross.
PRESCAN_SEPARATOR = "\n\x00\n"


def truncation_marker(omitted: int) -> str:
    return f"…[truncated by bastion: {omitted} bytes omitted]"


def truncate_utf8(text: str, limit: int) -> tuple[str, int]:
    """Cut ``text`` to at most ``limit`` UTF-8 bytes on a character boundary; returns (text, bytes omitted)."""
    if len(text) * 4 <= limit:
        return text, 0
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text, 0
    kept = raw[:limit].decode("utf-8", "ignore")
    return kept, len(raw) - len(kept.encode("utf-8"))


class StringSanitizer:
    """The policy, the report it fills, and whether a prescan ruled the pattern passes out for this walk."""

    def __init__(self, policy: EffectiveSanitizePolicy, report: SanitizeReport | None = None) -> None:
        self.policy = policy
        self.report = report if report is not None else SanitizeReport()
        # Cleared by prescan() when no secret rule or injection pattern can match anywhere in a JSON value.
        self._patterns = True
        # Set by prescan() when, besides, no string of the value has anything to clean: a string it saw then
        # comes out of ``string`` as it went in, but for truncation.
        self._plain = False
        # Set by prescan() when, besides, no string of the value is long enough to be cut at ``max_item_bytes`` and
        # nothing is nested deep enough to be refused: a walk of the value would hand back the value itself.
        self._untouched = False

    def string(self, value: str, limit: int | None = None, where: str | None = None, unseen: bool = False,
               key: str | None = None, left_out: int = 0) -> str:
        """Clean, redact, scan for injection, then truncate (last, so a cut never splits a secret unseen).

        ``unseen``: ``value`` is not a string a prescan looked at (a caller rewrote it first), so the pattern
        passes run whatever the prescan found. ``key``: the object key ``value`` sits under, which the secret
        rules see before it (``Redactor.redact``); the key itself is not rewritten here. ``left_out``: UTF-8 bytes
        of the text that a caller already cut off after ``value``, for the truncation marker.
        """
        beyond = left_out
        if limit is not None and len(value) > limit + SCAN_MARGIN:
            # Only what can leave is scanned: the first ``limit`` bytes and the margin (a character is at least one
            # byte, so ``limit`` characters hold at least what the cut keeps). Nothing is left to keep at 0.
            value, rest = window(value, limit + SCAN_MARGIN if limit > 0 else 0)
            beyond += rest
        if self._plain and not unseen:
            # The prescan saw this string: clean_text would return it unchanged and no pattern can match.
            if limit is None:
                return value
            return self._cut(value, limit, beyond, where)
        cleaned = clean_text(value)
        text = cleaned.text
        if cleaned.counts:
            self.report.add(cleaned.counts, where)
            self.report.add(self.policy.detector.hidden(value, cleaned.counts), where)
        if self._patterns or unseen:
            context = clean_text(key).text if key is not None else None
            text, counts = self.policy.redactor.redact(text, context)
            if counts:
                self.report.add(counts, where)
            text, counts = self.policy.detector.apply(text, self.policy.injection)
            if counts:
                self.report.add(counts, where)
        if limit is not None:
            return self._cut(text, limit, beyond, where)
        return text

    def _cut(self, text: str, limit: int, beyond: int, where: str | None) -> str:
        """``text`` cut to ``limit`` bytes, with the marker counting what the cut and the scan window left out."""
        text, omitted = truncate_utf8(text, limit)
        omitted += beyond
        if omitted:
            self.report.bump("truncated", where)
            text += truncation_marker(omitted)
        return text

    @property
    def patterns(self) -> bool:
        """False while a prescan found that no secret rule or injection pattern can match."""
        return self._patterns

    def prescan(self, value: Any) -> str | None:
        """One RE2 pass per pattern set over all strings of ``value`` (see ``Sanitizer.json_tree``); lasts for this
        walk. Returns the strings joined as scanned, or None when ``value`` was too deep to collect whole.

        Skipping the pattern passes is sound only if the prescan sees what they would see: each string as
        ``string()`` hands it to the matchers, that is cleaned (an invisible character that splits a secret is
        gone by then), and matched as if alone (anchors relaxed, ``PatternSet.may_match_joined``; the detector's
        prescan is a superset of its per-string scans, ``InjectionDetector.may_match``).
        """
        loose: list[str] = []
        members: list[str] = []
        deepest = [0]
        # Order does not matter to a prescan, only that each string stands between separators.
        joined = PRESCAN_SEPARATOR.join(loose + members) if _collect(value, loose, members, 0, deepest) else None
        limit = self.policy.max_item_bytes
        if joined is None or (len(joined) > limit + SCAN_MARGIN and _beyond_window(loose, members, limit)):
            self._patterns = True  # not every string was seen: scan each one as it is walked
            self._plain = False
            self._untouched = False
            return None
        # Cleaning is per string (its CR and joiner rules look at neighbours), so a tree with anything to clean
        # is joined again from its cleaned strings; one C-speed search says whether any string has (the rare case).
        count = len(loose) + len(members)
        unclean = bool(count) and needs_cleaning(joined, count - 1)
        if unclean:
            loose = [clean_text(s).text for s in loose]
            members = [clean_text(s).text for s in members]
            joined = PRESCAN_SEPARATOR.join(loose + members)
        self._patterns = (self._secrets_may_match(loose, members, joined)
                          or self.policy.detector.may_match(joined))
        self._plain = not unclean and not self._patterns
        # A value at depth d sits in a container at d - 1, so nothing is deeper than the deepest container + 1.
        self._untouched = (self._plain and deepest[0] + 1 <= MAX_DEPTH
                           and (len(joined) * 4 <= limit or (_all_fit(loose, limit) and _all_fit(members, limit))))
        return joined

    def _secrets_may_match(self, loose: list[str], members: list[str], joined: str) -> bool:
        """Whether a secret rule can match a string, a key, or a member as ``string(..., key=)`` shows it to the
        rules (``member_text``). The detector gets ``joined`` instead: its patterns need each string's edges."""
        redactor = self.policy.redactor
        if not members or not redactor.rule_ids:
            return redactor.may_match_joined(joined)
        # A member holds its key and its value between quotes, non-word characters, where the relaxed patterns
        # match whatever matches either alone: the members stand for their keys and values.
        return redactor.may_match_joined(PRESCAN_SEPARATOR.join(loose) + PRESCAN_SEPARATOR + members_text(members))


def window(text: str, size: int) -> tuple[str, int]:
    """The first ``size`` characters of ``text``, and how many UTF-8 bytes of it are left out."""
    rest = text[size:]
    return text[:size], len(rest) if rest.isascii() else len(rest.encode("utf-8", "surrogatepass"))


def _beyond_window(loose: list[str], members: list[str], max_item_bytes: int) -> bool:
    """Whether a string is longer than ``string()`` scans of any string with a limit: a prescan does not judge such
    a value (it would scan what no pass reads, and its verdict would cover keys, which are scanned whole)."""
    size = max_item_bytes + SCAN_MARGIN
    return bool(loose and max(map(len, loose)) > size) or bool(members and max(map(len, members)) > size)


def _all_fit(strings: list[str], limit: int) -> bool:
    """Whether every string is at most ``limit`` UTF-8 bytes (``truncate_utf8`` would keep each whole)."""
    if not strings or max(map(len, strings)) * 4 <= limit:  # a code point is at most 4 bytes
        return True
    return all(len(s) * 4 <= limit or len(s.encode("utf-8", "surrogatepass")) <= limit for s in strings)


def _collect(value: Any, loose: list[str], members: list[str], depth: int, deepest: list[int]) -> bool:
    """Append every key with its string value to ``members`` (key, value, key, value...) and every other string
    and key of ``value`` to ``loose``, and raise ``deepest[0]`` to the depth of the deepest container; False when
    ``value`` is nested too deep to collect whole."""
    if isinstance(value, str):
        loose.append(value)
    elif depth > 2 * MAX_DEPTH:
        return False
    elif isinstance(value, dict):
        if depth > deepest[0]:
            deepest[0] = depth
        append = loose.append
        for key, item in value.items():
            # A string member is appended here rather than in a call of its own (most members are strings).
            if isinstance(item, str):
                if isinstance(key, str):
                    members.append(key)
                    members.append(item)
                else:
                    append(item)
                continue
            if isinstance(key, str):
                append(key)
            if not _collect(item, loose, members, depth + 1, deepest):
                return False
    elif isinstance(value, list):
        if depth > deepest[0]:
            deepest[0] = depth
        for item in value:
            if type(item) is str:
                loose.append(item)
            elif not _collect(item, loose, members, depth + 1, deepest):
                return False
    return True
