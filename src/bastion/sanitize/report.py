"""What sanitizing one result or definition did: counts per class, never the removed content."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Count keys that make a finding worth a log line on their own (the rest are routine clean-up).
_NOTABLE = ("injection:", "secret:")
_HIDDEN = frozenset({"tag", "bidi", "escape_string", "zero_width", "variation_selector", "cross_tool_reference",
                     "unsafe_url", "unsafe_uri", "stack_trace"})


@dataclass(frozen=True, slots=True)
class Finding:
    """One notable thing found at one place, e.g. ``Finding("inputSchema.properties.q.description", "tag")``."""

    where: str
    kind: str


@dataclass(slots=True)
class SanitizeReport:
    """Accumulated while one result or definition is walked; goes to ``CallRecord.sanitize`` as ``counts``.

    Count keys: the text classes of ``clean_text`` (``escape``, ``tag``...), ``secret:<rule-id>``,
    ``injection:<pattern-id>``, and ``truncated``, ``oversized``, ``mime_blocked``, ``unsafe_uri``,
    ``unknown_content``, ``unsafe_url`` (icons, links), ``secret:key-name`` (a credential key's value),
    ``stack_trace``, ``cross_tool_reference``, ``content_blocks_omitted``.
    """

    counts: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    withheld: str | None = None

    def add(self, counts: Mapping[str, int], where: str | None = None) -> None:
        for key, n in counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
            if where is not None and (key.startswith(_NOTABLE) or key in _HIDDEN):
                self.findings.append(Finding(where, key))

    def bump(self, key: str, where: str | None = None) -> None:
        self.add({key: 1}, where)

    @property
    def injection(self) -> int:
        return sum(n for k, n in self.counts.items() if k.startswith("injection:"))
