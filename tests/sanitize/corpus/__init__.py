"""The prompt-injection corpus: JSONL files of tool outputs, one object per line.

``injection/*.jsonl``: outputs that carry an injection (``family`` and, for disguised ones, ``obfuscation``).
``benign/*.jsonl``: outputs that do not (``kind``: code, docs, log, stacktrace, transcript, json, ...).
Every record has ``id``, ``split`` (``dev``: used while tuning the detector; ``test``: held out) and ``text``.

A sample counts as flagged when sanitizing it as the text of a ``tools/call`` result in ``flag`` mode reports
any ``injection:*`` count: the same path a real result takes, including JSON parsing of JSON text blocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bastion.sanitize.config import EffectiveSanitizePolicy, SanitizeConfig
from bastion.sanitize.result import sanitize_result

CORPUS = Path(__file__).resolve().parent


def load(kind: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted((CORPUS / kind).glob("*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                row["file"] = f"{path.name}:{n}"
                rows.append(row)
    return rows


def flagged(text: str, policy: EffectiveSanitizePolicy) -> dict[str, int]:
    _, report = sanitize_result({"content": [{"type": "text", "text": text}]}, policy)
    return {k: n for k, n in report.counts.items() if k.startswith("injection:")}


@dataclass
class Score:
    injections: int = 0
    detected: int = 0
    benign: int = 0
    false_positives: int = 0
    misses: list[dict[str, Any]] = field(default_factory=list)
    fps: list[tuple[dict[str, Any], dict[str, int]]] = field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.detected / self.injections if self.injections else 0.0

    @property
    def fp_rate(self) -> float:
        return self.false_positives / self.benign if self.benign else 0.0


def evaluate(split: str | None = None, policy: EffectiveSanitizePolicy | None = None) -> Score:
    """Recall over the injection samples and false-positive rate over the benign ones (``split``: dev, test or
    None for both)."""
    policy = policy if policy is not None else SanitizeConfig.from_mapping({"injection": "flag"}).default
    score = Score()
    for row in load("injection"):
        if split is None or row["split"] == split:
            score.injections += 1
            if flagged(row["text"], policy):
                score.detected += 1
            else:
                score.misses.append(row)
    for row in load("benign"):
        if split is None or row["split"] == split:
            score.benign += 1
            hits = flagged(row["text"], policy)
            if hits:
                score.false_positives += 1
                score.fps.append((row, hits))
    return score
