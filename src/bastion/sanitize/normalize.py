# ruff: noqa: RUF001, RUF002  # the homoglyph table and its description are ambiguous characters on purpose
"""Detection views of a text: what a model reads once the disguise is taken off. Pure string functions.

These views are only ever scanned, never returned to a client: they are lossy on purpose (case, accents, script
and word boundaries are thrown away) so that one pattern covers the ways an instruction can be written.

- **fold** (``str``): NFKC (full-width forms, mathematical and circled letters, ligatures), then homoglyphs and
  accented Latin letters folded to ASCII in every word that mixes them with Latin or consists only of them (so
  ``іgnоrе`` with Cyrillic ``і``/``о``/``е`` reads ``ignore``, while Russian prose stays Russian), format and
  combining characters dropped, lower-cased. Structural families (role markers, template tokens, tool-call
  markup, JSON-RPC) and punctuation-bearing phrases are matched here.
- **squash** (``bytes``): the fold view with leetspeak folded (``1gn0r3`` → ``ignore``; ``l``, ``1``, ``|`` and
  ``!`` all become ``i``) and everything that is not a letter removed, so spacing, punctuation and line breaks
  between letters (``i g n o r e``, ``i.g.n.o.r.e``, ``ig-nore``) disappear. Directive phrases are matched here.

Cost: for ASCII text the fold view is ``str.lower()`` and the squash view one ``bytes.translate``, both C loops.
Non-ASCII text adds an NFKC quick check and one regex pass over the words that carry foldable characters.

``mapped_fold``/``mapped_squash`` build the same views character by character with a map back to the original
offsets. They are the slow path, used only to place ``neutralise`` rewrites after a hit.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from types import MappingProxyType

# Lookalikes that NFKC leaves alone. Cyrillic, Greek, Armenian, Cherokee, IPA and small capitals, plus colon
# lookalikes (a role marker is a word and a colon).
_LOOKALIKES = {
    "а": "a", "в": "b", "е": "e", "ё": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "ѕ": "s", "і": "i",
    "ї": "i", "ј": "j", "ԁ": "d", "һ": "h", "ӏ": "l", "ԛ": "q", "ԝ": "w", "к": "k", "м": "m", "т": "t", "п": "n",
    "г": "r", "ь": "b", "ԍ": "g", "А": "a", "В": "b", "Е": "e", "К": "k", "М": "m", "Н": "h", "О": "o", "Р": "p",
    "С": "c", "Т": "t", "Х": "x", "У": "y", "Ѕ": "s", "І": "i", "Ј": "j", "Ԛ": "q", "Ԝ": "w", "Һ": "h", "Ӏ": "l",
    "α": "a", "β": "b", "γ": "y", "δ": "d", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p",
    "τ": "t", "υ": "u", "χ": "x", "ω": "w", "ϲ": "c", "ϳ": "j", "Α": "a", "Β": "b", "Ε": "e", "Ζ": "z", "Η": "h",
    "Ι": "i", "Κ": "k", "Μ": "m", "Ν": "n", "Ο": "o", "Ρ": "p", "Τ": "t", "Υ": "y", "Χ": "x", "ϒ": "y",
    "օ": "o", "ս": "u", "ց": "g", "հ": "h", "ո": "n", "զ": "q",
    "Ꭺ": "a", "Ᏼ": "b", "Ꮯ": "c", "Ꭼ": "e", "Ꮋ": "h", "Ꭻ": "j", "Ꮶ": "k", "Ꮮ": "l", "Ꮇ": "m", "Ꮲ": "p",
    "Ꮪ": "s", "Ꭲ": "t", "Ꮃ": "w", "Ꮓ": "z",
    "ı": "i", "ȷ": "j", "ɑ": "a", "ɡ": "g", "ɩ": "i", "ɪ": "i", "ʀ": "r", "ʏ": "y", "ᴀ": "a", "ʙ": "b", "ᴄ": "c",
    "ᴅ": "d", "ᴇ": "e", "ɢ": "g", "ʜ": "h", "ᴊ": "j", "ᴋ": "k", "ʟ": "l", "ᴍ": "m", "ɴ": "n", "ᴏ": "o", "ᴘ": "p",
    "ꜱ": "s", "ᴛ": "t", "ᴜ": "u", "ᴠ": "v", "ᴡ": "w", "ᴢ": "z", "ǀ": "l", "ø": "o", "ð": "d", "þ": "p", "ł": "l",
    "đ": "d", "ħ": "h", "ŧ": "t", "ß": "ss", "æ": "ae", "œ": "oe", "Ø": "o", "Ł": "l", "Đ": "d", "Æ": "ae",
    "ː": ":", "∶": ":", "꞉": ":", "։": ":", "˸": ":",
}


def _build_fold() -> Mapping[int, str]:
    table: dict[int, str] = {}
    # Accented Latin letters (Latin-1 Supplement, Extended-A/B, Extended Additional) to their base letter.
    for cp in (*range(0xC0, 0x250), *range(0x1E00, 0x1F00)):
        base = unicodedata.normalize("NFKD", chr(cp))[:1]
        if base.isascii() and base.isalpha():
            table[cp] = base.lower()
    for char, ascii_ in _LOOKALIKES.items():
        table[ord(char)] = ascii_
    return MappingProxyType(table)


FOLD: Mapping[int, str] = _build_fold()
_FOLD_CLASS = "".join(sorted(re.escape(chr(cp)) for cp in FOLD))
# Dropped inside a word: combining marks (stacked diacritics) and format characters clean_text may have kept.
_MARKS = "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f\u200c\u200d"
_ANY_FOLDABLE = re.compile(f"[{_FOLD_CLASS}{_MARKS}]")
# A word made only of ASCII letters/digits, foldable characters and marks, with at least one of the latter.
# Whole words only: a word of Russian or Greek prose holds letters outside the table and is left as it is.
_FOLD_WORD = re.compile(f"(?<!\\w)[A-Za-z0-9_{_FOLD_CLASS}{_MARKS}]*[{_FOLD_CLASS}{_MARKS}]"
                        f"[A-Za-z0-9_{_FOLD_CLASS}{_MARKS}]*(?!\\w)")
_MARK_TABLE = {cp: None for lo, hi in ((0x300, 0x36F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF),
                                       (0xFE20, 0xFE2F), (0x200C, 0x200D)) for cp in range(lo, hi + 1)}
_WORD_TABLE: Mapping[int, str | None] = MappingProxyType({**_MARK_TABLE, **FOLD})


def _fold_word(m: re.Match[str]) -> str:
    return m.group().translate(_WORD_TABLE)


def fold(text: str) -> str:
    """The fold view (see the module docstring)."""
    if text.isascii():
        return text.lower()
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    if _ANY_FOLDABLE.search(text) is not None:
        text = _FOLD_WORD.sub(_fold_word, text)
    return text.lower()


# Leetspeak and the i/l/1 confusion: both sides of every squash pattern are written in this alphabet.
_LEET_FROM = b"0123456789@$!|+l"
_LEET_TO = b"oizeasgtbgasiiti"
_SQUASH_TABLE = bytes.maketrans(_LEET_FROM, _LEET_TO)
_SQUASH_KEEP = frozenset(b"abcdefghijklmnopqrstuvwxyz" + _LEET_FROM)
_SQUASH_DELETE = bytes(b for b in range(256) if b not in _SQUASH_KEEP)


def squash(folded: str) -> bytes:
    """The squash view of a fold view: letters only, leetspeak folded. Non-ASCII letters are dropped."""
    return folded.encode("utf-8", "surrogatepass").translate(_SQUASH_TABLE, _SQUASH_DELETE)


def squash_letter(char: str) -> str:
    """One squash-view letter for an ASCII ``char``, or "" when the squash view drops it."""
    if len(char) != 1 or not char.isascii():
        return ""
    b = ord(char)
    return chr(_SQUASH_TABLE[b]) if b in _SQUASH_KEEP else ""


def skeleton(phrase: str) -> str:
    """A squash pattern written in plain lower-case English, rewritten into the squash alphabet (``l`` → ``i``).

    Only letters are rewritten; the regex syntax used in squash patterns (groups, ``|``, ``?``, ``*``, ``{m,n}``)
    has no letters, and spaces are removed since the squash view has none.
    """
    return phrase.replace(" ", "").replace("l", "i")


def _fold_char(char: str) -> str:
    if char.isascii():
        return char.lower()
    norm = unicodedata.normalize("NFKC", char)
    out = []
    for c in norm:
        if c.isascii():
            out.append(c.lower())
        else:
            mapped = _WORD_TABLE.get(ord(c), c)
            if mapped:
                out.append(mapped.lower())
    return "".join(out)


def mapped_fold(text: str) -> tuple[str, list[int]]:
    """A fold view built per character, and for each of its characters the index in ``text`` it came from.

    Per-character NFKC can differ from whole-text NFKC in rare compositions; callers rerun their patterns on
    this view rather than reuse spans found on ``fold()``.
    """
    if text.isascii():
        return text.lower(), list(range(len(text)))
    parts: list[str] = []
    index: list[int] = []
    for i, char in enumerate(text):
        piece = _fold_char(char)
        parts.append(piece)
        index.extend([i] * len(piece))
    return "".join(parts), index


def mapped_squash(folded: str, fold_index: list[int]) -> tuple[str, list[int]]:
    """The squash view of a mapped fold view (as ``str``), with each letter's index in the original text."""
    letters: list[str] = []
    index: list[int] = []
    for i, char in enumerate(folded):
        letter = squash_letter(char)
        if letter:
            letters.append(letter)
            index.append(fold_index[i])
    return "".join(letters), index


# Letters spelled out one by one: "i g n o r e", "D/A/N", "y-o-u". Three or more single letters (or leet digits),
# each followed by one separator; a longer gap separates words.
SPACED_PATTERN = r"\b(?:[a-z0-9@$][ ./_*\-|+~,:]){2,}[a-z0-9@$]\b"
_SPACED = re.compile(r"(?<![^\W_])(?:[^\W_][ ./_*\-|+~,:]){2,}[^\W_](?![^\W_])")
_GAP = re.compile(r"[\s./_*\-|+~,:]+")


def collapse(folded: str, index: list[int] | None = None) -> tuple[str, list[int] | None]:
    """The fold view with spelled-out words joined and the gaps between them reduced to one space, so the
    fold-view patterns (which need word boundaries) read ``Y/o/u a/r/e n/o/w D/A/N`` as ``you are now dan``.

    With ``index`` (a map from ``folded`` to the original text), the map of the result is returned too.
    """
    parts: list[str] = []
    where: list[range | list[int]] = []
    pos = 0
    joined = False
    for m in _SPACED.finditer(folded):
        gap = folded[pos:m.start()]
        if joined and _GAP.fullmatch(gap):
            parts.append(" ")
            where.append([m.start() - 1])
        else:
            parts.append(gap)
            where.append(range(pos, m.start()))
        # Within a run the most common separator splits letters; any other one ("Y/o/u a/r/e") splits words.
        run = m.group()
        seps = [c for c in run if not c.isalnum()]
        inner = max(set(seps), key=seps.count)
        kept = [k for k in range(m.start(), m.end()) if folded[k] != inner]
        parts.append("".join(c if c.isalnum() else " " for c in (folded[k] for k in kept)))
        where.append(kept)
        pos = m.end()
        joined = True
    if not joined:
        return folded, index
    parts.append(folded[pos:])
    where.append(range(pos, len(folded)))
    mapped = [index[k] for span in where for k in span] if index is not None else None
    return "".join(parts), mapped
