"""Strip what can hide text from a human while a model still reads it. Pure string functions.

Order matters: escape sequences go first (their introducers are control characters, and their payloads would
otherwise survive as visible junk); the remaining classes are independent. Every class is counted so the audit
record says what was removed without repeating it.

Kept on purpose: ``\\n``, ``\\t`` and ``\\r\\n`` (a CR directly before LF cannot overwrite anything); ZWJ/ZWNJ
between two non-ASCII characters (emoji sequences, Indic and Persian scripts); one variation selector after a
base that can legitimately carry it. Not applied: NFKC, because it rewrites legitimate text (``x²`` → ``x2``,
full-width forms, ligatures); confusable spaces are mapped to ASCII instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

NO_COUNTS: Mapping[str, int] = MappingProxyType({})

# ASCII text needs work only if it holds a C0 control other than \t and \n, or DEL (ESC and \r included).
_ASCII_SUSPECT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

_ST = r"(?:\x07|\x1b\\|\x9c|(?=\x1b)|\Z)"  # BEL, ST (7- or 8-bit); an ESC or the end also ends a string
# OSC (incl. OSC 52 clipboard writes, OSC 8 hyperlinks), DCS, SOS, PM, APC: strings terminals swallow.
_ESCAPE_STRING = re.compile(rf"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*{_ST}")
# CSI (incl. private modes like ESC[?1049h), then every other ESC sequence (nF, Fp, Fe, Fs: ESC 7, ESC c, ESC(B).
_ESCAPE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b[ -/]*[0-~]")
_LONE_CR = re.compile(r"\r(?!\n)|\x85")  # CR moves the cursor back, NEL is a line break: both become \n
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x84\x86-\x9f]")
_BIDI = re.compile(r"[\u202a-\u202e\u2066-\u2069]")  # embeddings, overrides, isolates
_BIDI_MARK = re.compile(r"[\u061c\u200e\u200f]")
# Default-ignorable code points that render as nothing (joiners and variation selectors are handled apart).
_ZERO_WIDTH = re.compile(
    "[\u00ad\u034f\u115f\u1160\u17b4\u17b5\u180e\u200b\u2060-\u2065\u206a-\u206f\u3164\ufeff\uffa0"
    "\ufff0-\ufffb\U0001bca0-\U0001bca3\U0001d173-\U0001d17a]"
)
# A joiner survives only alone and between two non-ASCII characters.
_JOINER = re.compile(r"(?<![^\x00-\x7f])[\u200c\u200d]+|[\u200c\u200d]{2,}|[\u200c\u200d](?![^\x00-\x7f])")
# The tag block carries invisible ASCII ("ASCII smuggling"); the rest of plane 14 outside VS17-256 is ignorable.
_TAG = re.compile("[\U000e0000-\U000e00ff\U000e01f0-\U000e0fff]")
_VARIATION = re.compile("[\u180b-\u180d\u180f\ufe00-\ufe0f\U000e0100-\U000e01ef]+")
_SPACE = re.compile("[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]")
_LINE_SEP = re.compile("[\u2028\u2029]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # lone surrogates from JSON \ud800 escapes cannot be re-encoded

# Any character of any class above: text without one is returned untouched.
_SUSPECT = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00a0\u00ad\u034f\u061c\u115f\u1160\u1680\u17b4\u17b5\u180b-\u180f"
    "\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\u3164\ud800-\udfff\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)

# The same without NUL: ``needs_cleaning`` counts NULs apart, since its callers join strings with them.
_SUSPECT_BUT_NUL = re.compile(_SUSPECT.pattern.replace("\x00-\x08", "\x01-\x08", 1))

# The ASCII characters ``_ASCII_SUSPECT`` matches, for ``bytes.translate``.
_ASCII_REMOVED = bytes(b for b in range(128) if _ASCII_SUSPECT.match(chr(b)))

_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


class Cleaned(NamedTuple):
    text: str
    counts: Mapping[str, int]


def _variation_keep(text: str, start: int, run: str) -> str:
    """Keep the first selector of a run when its base can carry it; strip the rest (selector smuggling)."""
    base = text[start - 1] if start > 0 else ""
    first = run[0]
    if "\U000e0100" <= first <= "\U000e01ef":  # ideographic variation sequences
        return first if base and _CJK.match(base) else ""
    if first in "\ufe0e\ufe0f":
        # Text/emoji presentation. After an ASCII base only as a keycap (# * 0-9, the selector, U+20E3): a
        # selector after any other digit renders as nothing and would split a secret the redactor then misses.
        keycap = base in "#*0123456789" and text[start + len(run):start + len(run) + 1] == "\u20e3"
        return first if base and (not base.isascii() or keycap) else ""
    return first if base and not base.isascii() else ""


def clean_text(text: str) -> Cleaned:
    """Return ``text`` without hiding characters, and how many of each class were removed or replaced.

    Classes: ``escape`` (CSI and other ESC sequences), ``escape_string`` (OSC/DCS/SOS/PM/APC, incl. clipboard
    writes), ``control``, ``bidi`` (overrides, embeddings, isolates), ``bidi_mark``, ``zero_width``, ``tag``,
    ``variation_selector``, ``whitespace`` (confusable spaces and separators normalised), ``invalid``.
    """
    if text.isascii():
        if _ASCII_SUSPECT.search(text) is None:
            return Cleaned(text, NO_COUNTS)
    elif _SUSPECT.search(text) is None:
        return Cleaned(text, NO_COUNTS)
    counts: dict[str, int] = {}

    def sub(cls: str, pattern: re.Pattern[str], repl: str, value: str) -> str:
        value, n = pattern.subn(repl, value)
        if n:
            counts[cls] = counts.get(cls, 0) + n
        return value

    text = sub("escape_string", _ESCAPE_STRING, "", text)
    text = sub("escape", _ESCAPE, "", text)
    text = sub("control", _LONE_CR, "\n", text)
    text = sub("control", _CONTROL, "", text)
    if not text.isascii():
        text = sub("bidi", _BIDI, "", text)
        text = sub("bidi_mark", _BIDI_MARK, "", text)
        text = sub("zero_width", _ZERO_WIDTH, "", text)
        text = sub("tag", _TAG, "", text)
        text = sub("whitespace", _SPACE, " ", text)
        text = sub("whitespace", _LINE_SEP, "\n", text)
        text = sub("invalid", _SURROGATE, "", text)
        joined = _JOINER.sub("", text)
        if len(joined) != len(text):
            counts["zero_width"] = counts.get("zero_width", 0) + len(text) - len(joined)
            text = joined
        if _VARIATION.search(text):
            removed = 0

            def keep(m: re.Match[str]) -> str:
                nonlocal removed
                kept = _variation_keep(m.string, m.start(), m.group())
                removed += len(m.group()) - len(kept)
                return kept

            text = _VARIATION.sub(keep, text)
            if removed:
                counts["variation_selector"] = removed
    return Cleaned(text, MappingProxyType(counts) if counts else NO_COUNTS)


def needs_cleaning(text: str, nuls: int = 0) -> bool:
    """False only when ``clean_text`` returns every part of ``text`` unchanged (one C-speed search).

    ``nuls`` is how many NUL characters the caller put in ``text`` itself (separators between joined strings);
    any NUL beyond those belongs to a string, and cleaning removes it.
    """
    if text.isascii():
        # The common case, and a C loop at memory speed (a regex class scan costs ten times as much): deleting
        # the ASCII characters cleaning removes must delete exactly the separators' NULs.
        data = text.encode("ascii")
        return len(data) - len(data.translate(None, _ASCII_REMOVED)) != nuls
    return text.count("\x00") != nuls or _SUSPECT_BUT_NUL.search(text) is not None


def decode_tags(text: str) -> str:
    """The ASCII a run of tag characters spells (U+E0020-E007E), for scanning what was hidden."""
    return "".join(chr(ord(c) - 0xE0000) for c in text if "\U000e0020" <= c <= "\U000e007e")
