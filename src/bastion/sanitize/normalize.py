# ruff: noqa: RUF001, RUF002  # the homoglyph table and its description are ambiguous characters on purpose
"""Detection views of a text: what a model reads once the disguise is taken off. Pure string functions.

These views are only ever scanned, never returned to a client: they are lossy on purpose (case, accents, script
and word boundaries are thrown away) so that one pattern covers the ways an instruction can be written.

- **fold** (``str``, pure ASCII): NFKC (full-width forms, mathematical and circled letters and ligatures become
  ASCII), accented Latin letters mapped to their base letter, lookalike letters of other scripts mapped to Latin (so
  ``іgnоrе`` with Cyrillic ``і``/``о``/``е`` reads ``ignore``), every remaining non-ASCII character dropped
  (accents, format characters, other scripts, emoji), lower-cased. Structural families (role markers, template
  tokens, tool-call markup, JSON-RPC) and punctuation-bearing phrases are matched here.
- **squash** (``bytes``): the fold view with leetspeak folded (``1gn0r3`` → ``ignore``; ``l``, ``1``, ``|`` and
  ``!`` all become ``i``) and everything that is not a letter removed, so spacing, punctuation and line breaks
  between letters (``i g n o r e``, ``i.g.n.o.r.e``, ``ig-nore``) disappear. Directive phrases are matched here.

Cost: for ASCII text the fold view is ``str.lower()`` and the squash view one ``bytes.translate``, both C loops.
Non-ASCII text adds an NFKC quick check, one character-class scan, one ``str.replace`` per distinct foldable
character that occurs, and an ASCII encode: C loops too.

``mapped_fold``/``mapped_squash`` build the same views character by character with a map back to the original
offsets. They are the slow path, used only to place ``neutralise`` rewrites after a hit.
"""

from __future__ import annotations

import re
import unicodedata
from types import MappingProxyType

# Lookalikes that NFKC leaves alone: Cyrillic, Greek, Armenian, Cherokee, IPA and small capitals, letters that
# do not decompose (ø, ł, ß), and colon lookalikes (a role marker is a word and a colon).
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
    "ː": ":", "∶": ":", "꞉": ":", "։": ":", "˸": ":", "Ɩ": "l", "ꓲ": "i", "ǃ": "!",
}




def _build_fold() -> dict[str, str]:
    table: dict[str, str] = {}
    # Accented Latin letters that NFKC keeps precomposed (Latin-1 Supplement, Extended-A/B, Extended Additional).
    for cp in (*range(0xC0, 0x250), *range(0x1E00, 0x1F00)):
        base = unicodedata.normalize("NFKD", chr(cp))[:1]
        if base.isascii() and base.isalpha():
            table[chr(cp)] = base
    table.update(_LOOKALIKES)
    return table


_FOLD = MappingProxyType(_build_fold())
_FOLDABLE = re.compile("[" + "".join(sorted(re.escape(c) for c in _FOLD)) + "]")


def fold(text: str) -> str:
    """The fold view (see the module docstring): pure ASCII, lower-case."""
    if text.isascii():
        return text.lower()
    # NFKC turns compatibility forms (full-width, mathematical, circled, ligatures) into ASCII and composes
    # letter + combining accent; accented letters and lookalikes are then mapped, one str.replace per distinct
    # character present; every other non-ASCII character (stray marks, other scripts, emoji) is dropped. All C
    # loops: no per-character Python.
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    for char in set(_FOLDABLE.findall(text)):
        text = text.replace(char, _FOLD[char])
    return text.encode("ascii", "ignore").decode("ascii").lower()


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
    out = []
    for c in unicodedata.normalize("NFKC", char):
        c = _FOLD.get(c, c)
        if c.isascii():
            out.append(c.lower())
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
    where: list[int] = []
    pos = 0
    joined = False
    for m in _SPACED.finditer(folded):
        start, end = m.span()
        if joined and _GAP.fullmatch(folded, pos, start):
            parts.append(" ")
            if index is not None:
                where.append(start - 1)
        else:
            parts.append(folded[pos:start])
            if index is not None:
                where.extend(range(pos, start))
        # Within a run the most common separator splits letters; any other one ("Y/o/u a/r/e") splits words.
        run = m.group()
        seps = [c for c in run if not c.isalnum()]
        inner = max(set(seps), key=seps.count)
        parts.append("".join(c if c.isalnum() else " " for c in run if c != inner))
        if index is not None:
            where.extend(k for k in range(start, end) if folded[k] != inner)
        pos = end
        joined = True
    if not joined:
        return folded, index
    parts.append(folded[pos:])
    if index is None:
        return "".join(parts), None
    where.extend(range(pos, len(folded)))
    return "".join(parts), [index[k] for k in where]
