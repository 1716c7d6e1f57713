"""Prompt-injection markers in text that is about to enter a model's context.

The text is first normalised into detection views (``normalize``: NFKC, homoglyphs, case, leetspeak, spacing
and punctuation between letters), then matched against families of patterns (``families``), structural ones
judged in context (role markers, JSON-RPC), and encoded runs (base64, hex, percent) are decoded and scanned the
same way (``encoded``). Everything is linear in the text: two RE2 set passes, bounded candidate checks, and a
scan bound of ``MAX_SCAN_CHARS`` per string.

Detection is heuristic by nature: it catches the families and their disguises, not every instruction a
well-written paragraph can carry. That is why the default action only flags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import re2

from bastion.sanitize import families
from bastion.sanitize.encoded import MAX_PROBES, RUNS_PATTERN, decoded_runs
from bastion.sanitize.families import FOLD_PATTERNS, JSONRPC, ROLE_LINE, SQUASH_PATTERNS
from bastion.sanitize.normalize import SPACED_PATTERN, collapse, fold, mapped_fold, mapped_squash, squash
from bastion.sanitize.patterns import Hit, non_overlapping
from bastion.sanitize.text import NO_COUNTS, decode_tags

InjectionAction = Literal["flag", "neutralise", "block"]
INJECTION_ACTIONS: tuple[InjectionAction, ...] = ("flag", "neutralise", "block")

# The scan bound per string (the default max_item_bytes is 2 MiB, so by default every item is scanned whole).
MAX_SCAN_CHARS = 2 * 1024 * 1024
# Neutralising maps detection views back to the text character by character: bounded to this much text.
CHUNK_CHARS = 8192
MAX_MAPPED_CHUNKS = 16
# Parsed JSON text blocks: how much of the tree is looked at for tool-call and JSON-RPC shapes.
MAX_JSON_NODES = 10_000
MAX_JSON_DEPTH = 8
# Encoded runs inside decoded runs (base64 of hex...) are followed this deep.
MAX_ENCODING_DEPTH = 2

# What text.py removed that only makes sense as hiding: tag characters (invisible ASCII), bidi overrides and
# isolates, and terminal strings (OSC/DCS/APC...). Colour codes, BOMs and soft hyphens are too common to count.
HIDDEN_CLASSES: tuple[str, ...] = ("tag", "bidi", "escape_string")

_ROLE = "candidate:role"
_JSONRPC = "candidate:jsonrpc"
_ENCODED = "candidate:encoded"
_SPACED = "candidate:spaced"

_TRANSLATE = str.maketrans({"<": "\u2039", ">": "\u203a", "[": "(", "]": ")", "|": "\u00a6"})


def neutralise(span: str) -> str:
    """The visible, defanged replacement of a flagged span (documented in docs/security.md)."""
    return f'[bastion: possible prompt injection: "{span.translate(_TRANSLATE)}"]'


def _options() -> Any:
    opts = re2.Options()
    opts.log_errors = False
    opts.max_mem = 64 << 20  # the phrase grammars are large alternations; the default 8 MiB DFA budget thrashes
    return opts


class _View:
    """One RE2 set over a detection view, plus each member's own program to find spans."""

    __slots__ = ("ids", "progs", "set")

    def __init__(self, patterns: Sequence[tuple[str, str]]) -> None:
        self.ids = tuple(pid for pid, _ in patterns)
        self.progs = tuple(re2.compile(p, _options()) for _, p in patterns)
        rset = re2.Set.SearchSet(_options())
        for _, pattern in patterns:
            rset.Add(pattern)
        rset.Compile()
        self.set = rset

    def members(self, data: bytes) -> list[int]:
        return sorted(self.set.Match(data) or ())

    def hits(self, members: list[int], text: str | bytes) -> list[Hit]:
        """Non-overlapping hits of the family members: leftmost first, then longest, then the earlier pattern."""
        raw: list[Hit] = []
        for i in members:
            if self.ids[i].startswith("candidate:"):
                continue
            for m in self.progs[i].finditer(text):
                start, end = m.span()
                if end > start:
                    raw.append(Hit(i, start, end))
        return non_overlapping(raw)


def _chunks(text: str) -> list[tuple[int, int]]:
    """Spans of whole lines, each at most ``CHUNK_CHARS`` long (a longer line is cut)."""
    out: list[tuple[int, int]] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + CHUNK_CHARS)
        if end < len(text):
            cut = text.rfind("\n", start, end)
            if cut > start:
                end = cut + 1
        out.append((start, end))
        start = end
    return out


def _add(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


class InjectionDetector:
    """Compiled once; immutable and shareable."""

    __slots__ = ("_fold", "_squash")

    def __init__(self) -> None:
        self._fold = _View((*FOLD_PATTERNS, (_ROLE, ROLE_LINE), (_JSONRPC, JSONRPC),
                            (_ENCODED, "(?i)" + RUNS_PATTERN), (_SPACED, SPACED_PATTERN)))
        self._squash = _View(SQUASH_PATTERNS)

    def may_match(self, text: str) -> bool:
        """False only if scanning any part of ``text`` on its own cannot find anything.

        Used on all strings of a JSON tree joined, so that a clean tree costs one scan instead of one per
        string. The scan is made a superset of the per-string scans: the whole text is scanned (each string is
        scanned up to ``MAX_SCAN_CHARS`` on its own, wherever it sits in the joined text), every encoded run is
        probed (a joined tree may hold more runs than one string's budget), role markers count without the
        transcript exemption (which depends on the string a marker stands in), and a structural family with more
        candidates than its budget counts as found (its last candidates may stand in a string of their own).
        """
        return bool(self._scan(text, 0, None, prescan=True))

    def scan(self, text: str) -> Mapping[str, int]:
        """Counts keyed ``injection:<family>`` (``injection:encoded-<family>`` for what an encoded run hid)."""
        return self._scan(text[:MAX_SCAN_CHARS], 0, None)

    def _scan(self, text: str, depth: int, spans: list[tuple[int, int]] | None,
              prescan: bool = False) -> dict[str, int]:
        """Counts; with ``spans``, also the spans in ``text`` to rewrite (the slow, mapped path)."""
        counts: dict[str, int] = {}
        if spans is None:
            folded = fold(text)
            fold_index: list[int] | None = None
            squashed: str | bytes = squash(folded)
        else:
            folded, fold_index = mapped_fold(text)
            squashed, squash_index = mapped_squash(folded, fold_index)
        fold_members = self._fold.members(folded.encode("utf-8", "surrogatepass"))
        squash_data = squashed if isinstance(squashed, bytes) else squashed.encode("ascii")
        squash_members = self._squash.members(squash_data) if squash_data else []
        if not fold_members and not squash_members:
            return counts
        view_spans: list[tuple[int, int]] = []
        spans_c: list[tuple[int, int]] = []  # already in original coordinates
        for hit in self._fold.hits(fold_members, folded):
            _add(counts, f"injection:{self._fold.ids[hit.index]}")
            view_spans.append((hit.start, hit.end))
        for i in fold_members:
            kind = self._fold.ids[i]
            if kind == _ROLE:
                n = families.role_turns(folded, view_spans, lenient=prescan)
                if n:
                    _add(counts, "injection:role-turn", n)
            elif kind == _JSONRPC:
                n = families.jsonrpc_messages(folded, view_spans, lenient=prescan)
                if n:
                    _add(counts, "injection:jsonrpc-message", n)
            elif kind == _ENCODED and depth < MAX_ENCODING_DEPTH:
                limit = len(text) if prescan else MAX_PROBES
                for run in decoded_runs(text, max_probes=limit, max_runs=limit):
                    inner = self._scan(run.text, depth + 1, None)
                    for key, n in inner.items():
                        family = key.removeprefix("injection:").removeprefix("encoded-")
                        _add(counts, f"injection:encoded-{family}", n)
                    if inner and spans is not None:
                        spans.append((run.start, run.end))
            elif kind == _SPACED:
                # Spelled-out words joined: the fold-view families get a second look (new families only, so a
                # phrase already counted is not counted twice).
                collapsed, collapsed_index = collapse(folded, fold_index)
                members = self._fold.members(collapsed.encode("utf-8", "surrogatepass"))
                seen = set(counts)
                for hit in self._fold.hits(members, collapsed):
                    key = f"injection:{self._fold.ids[hit.index]}"
                    if key not in seen:
                        _add(counts, key)
                    if collapsed_index is not None:
                        spans_c.append((collapsed_index[hit.start], collapsed_index[hit.end - 1] + 1))
        squash_hits = self._squash.hits(squash_members, squashed)
        for hit in squash_hits:
            _add(counts, f"injection:{self._squash.ids[hit.index]}")
        if spans is not None and fold_index is not None:
            for start, end in view_spans:
                spans.append((fold_index[start], fold_index[end - 1] + 1))
            for hit in squash_hits:
                spans.append((squash_index[hit.start], squash_index[hit.end - 1] + 1))
            spans.extend(spans_c)
        return counts

    def apply(self, text: str, action: InjectionAction) -> tuple[str, Mapping[str, int]]:
        """Counts keyed ``injection:<id>``; with ``neutralise`` each flagged span is rewritten by ``neutralise()``.

        Spans are found on the detection views and mapped back to ``text``; a span that an obfuscation spread
        out (``i g n o r e ...``) is rewritten whole, from its first to its last letter.
        """
        counts = self.scan(text)
        if not counts:
            return text, NO_COUNTS
        if action != "neutralise":
            return text, counts
        spans = self._spans(text[:MAX_SCAN_CHARS])
        if not spans:
            return text, counts
        spans.sort()
        parts: list[str] = []
        pos = 0
        for start, end in spans:
            if end <= pos:
                continue
            start = max(start, pos)
            # Patterns may consume a delimiter on either side; the rewrite keeps it outside the marker.
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            if end <= start:
                continue
            parts.append(text[pos:start])
            parts.append(neutralise(text[start:end]))
            pos = end
        parts.append(text[pos:])
        return "".join(parts), counts

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """Where to rewrite: the slow, per-character mapped views, built only for the chunks that hit.

        A chunk is a run of whole lines of at most ``CHUNK_CHARS``; at most ``MAX_MAPPED_CHUNKS`` are mapped, and a
        hit chunk beyond that is rewritten whole, so a hostile text cannot make neutralising cost more than a
        bounded amount of per-character Python. If no chunk hits on its own (a phrase across a chunk boundary),
        the whole scanned text is mapped once within the same budget or rewritten whole.
        """
        chunks = _chunks(text)
        spans: list[tuple[int, int]] = []
        mapped = 0
        for start, end in chunks:
            chunk = text[start:end]
            if not self._scan(chunk, 0, None):
                continue
            if mapped >= MAX_MAPPED_CHUNKS:
                spans.append((start, end))
                continue
            mapped += 1
            local: list[tuple[int, int]] = []
            self._scan(chunk, 0, local)
            spans.extend((start + a, start + b) for a, b in local)
        if spans or not text:
            return spans
        if len(text) <= CHUNK_CHARS * MAX_MAPPED_CHUNKS:
            self._scan(text, 0, spans)
            return spans
        return [(0, len(text))]

    def scan_json(self, value: Any) -> Mapping[str, int]:
        """Structural families in a parsed JSON text block, whose strings are scanned one by one and so never
        show the shape: a JSON-RPC message with an MCP method or an MCP-shaped result, or a tool call
        (``tool_calls``, ``function_call``, ``{"name": ..., "arguments": {...}}``, ``"type": "tool_use"``)."""
        counts: dict[str, int] = {}
        stack: list[tuple[Any, int]] = [(value, 0)]
        nodes = 0
        while stack and nodes < MAX_JSON_NODES:
            node, depth = stack.pop()
            nodes += 1
            if isinstance(node, dict):
                kind = families.json_shape(node)
                if kind is not None:
                    _add(counts, f"injection:{kind}")
                    continue  # one shape is one finding: its parts (the call inside tool_calls) are not more
                children: Any = node.values()
            elif isinstance(node, list):
                children = node
            else:
                continue
            if depth < MAX_JSON_DEPTH:
                stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
        return counts

    def hidden(self, original: str, cleaning: Mapping[str, int]) -> Mapping[str, int]:
        """Signals from what cleaning removed; text smuggled in tag characters is decoded and scanned too."""
        total = sum(cleaning.get(c, 0) for c in HIDDEN_CLASSES)
        if not total:
            return NO_COUNTS
        counts = {"injection:hidden-text": 1}
        if cleaning.get("tag"):
            for key, n in self.scan(decode_tags(original)).items():
                hidden_key = key.replace("injection:", "injection:hidden-", 1)
                counts[hidden_key] = counts.get(hidden_key, 0) + n
        return counts
