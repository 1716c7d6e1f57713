"""Prompt-injection markers in text that is about to enter a model's context.

Detection is heuristic by nature: the patterns catch the common, blunt forms (override phrases, chat-template
role tokens, fake tool-call markup, concealment requests) and the fact that something was hidden. They cannot
catch a well-written paraphrase. That is why the default action only flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from bastion.sanitize.patterns import PatternSet
from bastion.sanitize.text import NO_COUNTS, decode_tags

InjectionAction = Literal["flag", "neutralise", "block"]
INJECTION_ACTIONS: tuple[InjectionAction, ...] = ("flag", "neutralise", "block")

# (id, RE2 pattern). Ids appear in audit counts as ``injection:<id>``.
INJECTION_PATTERNS: tuple[tuple[str, str], ...] = (
    ("ignore-previous", r"(?i)\b(?:ignore|disregard|forget|override|bypass)\s+(?:all\s+|any\s+|the\s+|your\s+)*"
                        r"(?:previous|prior|above|earlier|preceding|original|system)\s+"
                        r"(?:instructions?|prompts?|directions?|rules|guidelines|context|messages?)"),
    ("new-instructions", r"(?i)\b(?:new|updated|real|actual|revised)\s+(?:system\s+)?instructions?\s*:"),
    ("role-reassignment", r"(?i)\byou\s+are\s+now\s+(?:a|an|the|no\s+longer|DAN|in\s+\w+\s+mode|acting\s+as)\b"
                          r"|\bfrom\s+now\s+on,?\s+you\s+(?:are|will|must|should)\b"),
    ("system-prompt", r"(?i)\b(?:reveal|print|show|output|repeat|leak|disclose|override|ignore)\s+"
                      r"(?:your|the|all)\s+(?:system\s+prompt|system\s+message|hidden\s+instructions)"),
    ("chat-template-token", r"<\|(?:im_start|im_end|im_sep|system|user|assistant|endoftext|eot_id|"
                            r"start_header_id|end_header_id|begin_of_text)\|>|\[/?INST\]|<</?SYS>>"),
    ("fake-tool-call", r"(?i)</?(?:tool_call|tool_calls|tool_use|tool_result|function_call|function_calls|"
                       r"function_results|invoke)\b[^>]{0,200}>"),
    ("conceal-from-user", r"(?i)\b(?:do\s+not|don't|never|without)\s+(?:tell|telling|inform|informing|mention|"
                          r"mentioning|reveal|revealing|show|showing|alert|alerting|notify|notifying)\s+"
                          r"(?:this\s+(?:to\s+)?)?(?:the\s+|your\s+)?user\b"),
    ("directive-tag", r"(?i)<(?:important|system|instructions?|admin|secret)>"),
)

# What text.py removed that only makes sense as hiding: tag characters (invisible ASCII), bidi overrides and
# isolates, and terminal strings (OSC/DCS/APC...). Colour codes, BOMs and soft hyphens are too common to count.
HIDDEN_CLASSES: tuple[str, ...] = ("tag", "bidi", "escape_string")

_TRANSLATE = str.maketrans({"<": "\u2039", ">": "\u203a", "[": "(", "]": ")", "|": "\u00a6"})


def neutralise(span: str) -> str:
    """The visible, defanged replacement of a flagged span (documented in docs/security.md)."""
    return f'[bastion: possible prompt injection: "{span.translate(_TRANSLATE)}"]'


class InjectionDetector:
    """Compiled once; immutable and shareable."""

    __slots__ = ("_ids", "_set")

    def __init__(self, patterns: tuple[tuple[str, str], ...] = INJECTION_PATTERNS) -> None:
        self._ids = tuple(pid for pid, _ in patterns)
        self._set = PatternSet([p for _, p in patterns], path="injection")

    def may_match(self, text: str) -> bool:
        return self._set.may_match(text)

    def apply(self, text: str, action: InjectionAction) -> tuple[str, Mapping[str, int]]:
        """Counts keyed ``injection:<id>``; with ``neutralise`` each match is rewritten by ``neutralise()``."""
        hits = self._set.hits(text)
        if not hits:
            return text, NO_COUNTS
        counts: dict[str, int] = {}
        for hit in hits:
            key = f"injection:{self._ids[hit.index]}"
            counts[key] = counts.get(key, 0) + 1
        if action != "neutralise":
            return text, counts
        parts: list[str] = []
        pos = 0
        for hit in hits:
            parts.append(text[pos:hit.start])
            parts.append(neutralise(text[hit.start:hit.end]))
            pos = hit.end
        parts.append(text[pos:])
        return "".join(parts), counts

    def hidden(self, original: str, cleaning: Mapping[str, int]) -> Mapping[str, int]:
        """Signals from what cleaning removed; text smuggled in tag characters is decoded and scanned too."""
        total = sum(cleaning.get(c, 0) for c in HIDDEN_CLASSES)
        if not total:
            return NO_COUNTS
        counts = {"injection:hidden-text": 1}
        if cleaning.get("tag"):
            for key, n in self.apply(decode_tags(original), "flag")[1].items():
                hidden_key = key.replace("injection:", "injection:hidden-", 1)
                counts[hidden_key] = counts.get(hidden_key, 0) + n
        return counts
