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

import re2

MAX_RUNS = 32  # decoded in full
MAX_PROBES = 128  # runs probed; lower-case-only runs (paths, identifiers) are skipped without counting
MAX_RUN_CHARS = 8192
MIN_TEXT_BYTES = 12
_PROBE = 48

# Shortest runs: 20 base64 characters (15 bytes), 24 hex digits (12 bytes). The detector's prefilter uses the
# union; decoding runs one RE2 pattern per encoding, on UTF-8 bytes (the RE2 wrapper's per-match cost on ``str``
# is several times higher, and a log full of long identifiers has many candidate runs).
_B64 = rb"[A-Za-z0-9+/_\-]{20,}={0,2}"
_XESC = rb"(?:\\x[0-9A-Fa-f]{2}){8,}"
_HEXSEP = rb"(?:[0-9A-Fa-f]{2}[ :,\-]){8,}[0-9A-Fa-f]{2}"
_PCT = rb"(?:%[0-9A-Fa-f]{2}[A-Za-z0-9 ._\-]{0,3}){8,}"
RUNS_PATTERN = "|".join(p.decode() for p in (_B64, _XESC, _HEXSEP, _PCT))
_RUNS = {kind: re2.compile(pattern) for kind, pattern in (("b64", _B64), ("xesc", _XESC), ("hexsep", _HEXSEP),
                                                           ("pct", _PCT))}
_HEX = re.compile(rb"(?:0[xX])?[0-9A-Fa-f]+")


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


def _b64(run: bytes) -> bytes | None:
    body = run.rstrip(b"=")
    altchars = b"-_" if (b"-" in body or b"_" in body) else None
    if altchars is not None and (b"+" in body or b"/" in body):
        return None
    body += b"=" * (-len(body) % 4)
    try:
        return base64.b64decode(body, altchars=altchars, validate=True)
    except (binascii.Error, ValueError):
        return None


def _decode(kind: str, run: bytes) -> bytes | None:
    try:
        if kind == "b64":
            if _HEX.fullmatch(run):
                digits = run[2:] if run[:2] in (b"0x", b"0X") else run
                return bytes.fromhex(digits.decode()) if len(digits) % 2 == 0 else None
            return _b64(run)
        if kind == "xesc":
            return bytes.fromhex(run.replace(b"\\x", b"").decode())
        if kind == "hexsep":
            return bytes.fromhex(re.sub(rb"[ :,\-]", b"", run).decode())
        return unquote_to_bytes(run)
    except ValueError:
        return None


def decoded_runs(text: str, max_probes: int = MAX_PROBES, max_runs: int = MAX_RUNS) -> list[Decoded]:
    """The encoded runs of ``text`` that decode to text, with their spans in ``text``."""
    data = text.encode("utf-8", "surrogatepass")
    out: list[Decoded] = []
    probes = 0
    for kind, prog in _RUNS.items():
        if (kind == "xesc" and b"\\x" not in data) or (kind == "pct" and b"%" not in data):
            continue
        for m in prog.finditer(data):
            if probes >= max_probes or len(out) >= max_runs:
                return out
            run = m.group()[:MAX_RUN_CHARS]
            # Base64 of text mixes cases; hex is digits and a-f. Anything else is a name or a path.
            if kind == "b64" and not (_HEX.fullmatch(run) or (not run.islower() and not run.isupper())):
                continue
            probes += 1
            if kind == "b64":
                if run in _KEYWORDS_NOT_TEXT:
                    continue  # decided at import by this very probe (below): not text
                probe = run[:_PROBE - _PROBE % 4] if len(run) > _PROBE else run
                head = _decode(kind, probe)
                if head is None or _as_text(head[:36] if len(head) > 36 else head) is None:
                    continue
            raw = _decode(kind, run)
            decoded = _as_text(raw) if raw is not None else None
            if decoded is not None:
                start, end = m.span()
                if not text.isascii():
                    start = len(data[:start].decode("utf-8", "surrogatepass"))
                    end = start + len(m.group().decode("utf-8", "surrogatepass"))
                out.append(Decoded(start, end, decoded))
    return out


def _probe_fails(run: bytes) -> bool:
    """Whether the b64 probe of ``decoded_runs`` drops ``run`` before decoding it in full."""
    probe = run[:_PROBE - _PROBE % 4] if len(run) > _PROBE else run
    head = _decode("b64", probe)
    return head is None or _as_text(head[:36] if len(head) > 36 else head) is None


# JSON Schema keywords long and mixed-case enough to look like base64: every tool schema has some, and each would
# be probed on every definition scanned. Only those the probe itself drops are listed, so skipping is exact.
_KEYWORDS_NOT_TEXT = frozenset(word for word in (b"additionalProperties", b"unevaluatedProperties")
                               if _probe_fails(word))
