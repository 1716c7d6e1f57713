"""Names and globs: what a rule may say, and what a name must look like before any rule can match it.

Tool and prompt names are compared byte for byte over a deliberately small ASCII alphabet. A name outside it
(a Cyrillic U+0430 standing in for 'a', a zero-width space, a fullwidth letter) is never matched by a glob, so a
look-alike can never ride on a rule written for the real name. Resource URIs are judged in their canonical form
(``bastion.uris``), and so are the literal parts of resource globs: every spelling of one URI meets the same rules.
A URI that has no canonical form, or whose path could still climb (``..`` in an opaque URI), never matches an allow
glob.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import re2

from bastion.uris import canonical_glob, glob_problem

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_NAME_GLOB_CHAR = re.compile(r"[A-Za-z0-9_.\-*?]")
_NAME_GLOB = re.compile(r"[A-Za-z0-9_.\-*?]+")
# Printable ASCII without space: what a URI may contain once percent-encoded.
_URI = re.compile(r"[\x21-\x7e]+")
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c|00)", re.IGNORECASE)


def is_safe_name(name: str) -> bool:
    """True if ``name`` uses only ``[A-Za-z0-9_.-]``; any other name is never matched by a rule."""
    return _NAME.fullmatch(name) is not None


def check_name_glob(text: str) -> str | None:
    """Why ``text`` is not a valid tool/prompt glob, or None if it is."""
    if _NAME_GLOB.fullmatch(text) is None:
        bad = sorted({c for c in text if not _NAME_GLOB_CHAR.fullmatch(c)})
        shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in bad) or "empty glob"
        return (f"invalid glob {text!r}: only ASCII letters, digits, '_', '.', '-' and the wildcards '*' and '?' "
                f"are allowed; found {shown}")
    return None


def check_uri_glob(text: str) -> str | None:
    """Why ``text`` is not a valid resource URI glob, or None if it is."""
    if _URI.fullmatch(text) is None:
        return f"invalid URI glob {text!r}: only printable ASCII without spaces is allowed (percent-encode the rest)"
    if text.endswith("\\") and not text.endswith("\\\\"):
        return f"invalid URI glob {text!r}: a trailing backslash escapes nothing"
    problem = glob_problem(text)
    if problem is not None:
        return f"invalid URI glob {text!r}: it could never match, since {problem}"
    return None


def is_safe_uri(uri: str) -> bool:
    """True if ``uri`` is printable ASCII and its path cannot climb (``..``, ``%2e``, ``%2f``, ``\\``, NUL)."""
    if _URI.fullmatch(uri) is None or _ENCODED_SEPARATOR.search(uri):
        return False
    decoded = unquote(uri)
    # A '%' left after decoding means double encoding: the upstream may decode once more than we did.
    if "%" in decoded or "\\" in decoded:
        return False
    path = decoded.split("?", 1)[0].split("#", 1)[0]
    return not any(seg in (".", "..") for seg in path.split("/"))


@dataclass(frozen=True, slots=True)
class Glob:
    """A compiled glob: ``*`` matches any run of characters (also empty, also across ``__`` and ``/``), ``?``
    exactly one character. Matching is case-sensitive and anchored at both ends."""

    text: str
    regex: Any  # a compiled re2 pattern: linear-time matching whatever the glob and the name

    def matches(self, value: str) -> bool:
        return self.regex.fullmatch(value) is not None


def compile_name_glob(text: str) -> Glob:
    """Compile a tool/prompt glob already checked by ``check_name_glob``. There is nothing to escape: names can
    contain neither ``*`` nor ``?``."""
    return Glob(text, re2.compile(_translate(text, escapes=False)))


def compile_uri_glob(text: str) -> Glob:
    """Compile a resource URI glob already checked by ``check_uri_glob``. URIs may contain ``*`` and ``?``, so
    ``\\*``, ``\\?`` and ``\\\\`` stand for the literal characters. The literal parts are brought to the canonical
    form URIs are matched in (``bastion.uris.canonical_glob``): ``FILE:///srv/%73ecret/*`` matches what
    ``file:///srv/secret/*`` does."""
    return Glob(text, re2.compile(_translate(canonical_glob(text), escapes=True)))


def _translate(text: str, *, escapes: bool) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if escapes and c == "\\" and i + 1 < len(text):
            out.append(re.escape(text[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "*" else "." if c == "?" else re.escape(c))
        i += 1
    # DOTALL so '*' spans any character; the input alphabet has no newlines anyway.
    return "(?s:" + "".join(out) + ")"
