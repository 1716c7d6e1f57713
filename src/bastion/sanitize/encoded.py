"""Directives wrapped in an encoding: base64 (standard and URL-safe), hex (plain, ``\\x``-escaped, byte lists),
percent-encoding. Pure, and bounded: at most ``MAX_RUNS`` runs per text, ``MAX_RUN_CHARS`` of each, and a run is
only decoded in full when its first bytes already decode to text.

Binary payloads (images, hashes, keys, UUIDs) decode to bytes that are not text and are dropped after the
probe, so a benign output full of SHAs or base64 images costs one regex pass plus a 48-character probe per run.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

from bastion.sanitize.patterns import compile_any

MAX_RUNS = 32  # decoded in full
MAX_PROBES = 128  # runs probed; lower-case-only runs (paths, identifiers) are skipped without counting
MAX_RUN_CHARS = 8192
MIN_TEXT_BYTES = 12
_PROBE = 48

# Shortest runs: 20 base64 characters (15 bytes), 24 hex digits (12 bytes).
RUNS_PATTERN = (r"(?P<hex0x>0[xX][0-9A-Fa-f]{24,})"
                r"|(?P<b64>[A-Za-z0-9+/_\-]{20,}={0,2})"
                r"|(?P<xesc>(?:\\x[0-9A-Fa-f]{2}){8,})"
                r"|(?P<hexsep>(?:[0-9A-Fa-f]{2}[ :,\-]){8,}[0-9A-Fa-f]{2})"
                r"|(?P<pct>(?:%[0-9A-Fa-f]{2}[A-Za-z0-9 ._\-]{0,3}){8,})")
_RUNS = compile_any(RUNS_PATTERN, "encoded")
_HEX = re.compile(r"[0-9A-Fa-f]+")


class Decoded(NamedTuple):
    start: int
    end: int
    text: str


def _as_text(raw: bytes) -> str | None:
    """``raw`` as text if it reads like text: valid UTF-8, printable, mostly letters and spaces."""
    if len(raw) < MIN_TEXT_BYTES:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        # A probe may cut a multi-byte character at its end.
        try:
            text = raw[:-3].decode("utf-8") if len(raw) > MIN_TEXT_BYTES + 3 else ""
        except UnicodeDecodeError:
            return None
        if not text:
            return None
    printable = sum(1 for c in text if c.isprintable() or c in "\n\t\r")
    letters = sum(1 for c in text if c.isalpha() or c == " ")
    if printable < 0.95 * len(text) or letters < 0.6 * len(text):
        return None
    return text


def _b64(run: str) -> bytes | None:
    body = run.rstrip("=")
    altchars = b"-_" if ("-" in body or "_" in body) else None
    if altchars is not None and ("+" in body or "/" in body):
        return None
    body += "=" * (-len(body) % 4)
    try:
        return base64.b64decode(body, altchars=altchars, validate=True)
    except (binascii.Error, ValueError):
        return None


def _decode(kind: str, run: str) -> bytes | None:
    if kind == "b64":
        if len(run) % 2 == 0 and _HEX.fullmatch(run):
            return bytes.fromhex(run)
        return _b64(run)
    if kind == "hex0x":
        return bytes.fromhex(run[2:]) if len(run) % 2 == 0 else None
    if kind == "xesc":
        return bytes.fromhex(run.replace("\\x", ""))
    if kind == "hexsep":
        return bytes.fromhex(re.sub(r"[ :,\-]", "", run))
    return unquote_to_bytes(run)


def decoded_runs(text: str) -> list[Decoded]:
    """The encoded runs of ``text`` that decode to text, with their spans in ``text``."""
    out: list[Decoded] = []
    probes = 0
    for m in _RUNS.finditer(text):
        if probes >= MAX_PROBES or len(out) >= MAX_RUNS:
            break
        kind = next(k for k in ("hex0x", "b64", "xesc", "hexsep", "pct") if m.group(k) is not None)
        run = m.group()[:MAX_RUN_CHARS]
        # Base64 of text mixes cases; hex is all digits and a-f. Anything else is a name or a path.
        if kind == "b64" and not (_HEX.fullmatch(run) or (not run.islower() and not run.isupper())):
            continue
        probes += 1
        if kind == "b64":
            probe = run[:_PROBE - _PROBE % 4] if len(run) > _PROBE else run
            head = _decode(kind, probe)
            if head is None or _as_text(head[:36] if len(head) > 36 else head) is None:
                continue
        raw = _decode(kind, run)
        decoded = _as_text(raw) if raw is not None else None
        if decoded is not None:
            out.append(Decoded(m.start(), m.end(), decoded))
    return out
