"""Prompt-injection detection: recall and false-positive rate on the corpus, and the detector's CPU cost.

    python bench/injection_eval.py [--verbose] [--seconds 1.0]

The corpus is ``tests/sanitize/corpus`` (see its ``__init__``). Each sample is sanitized as the text of a
``tools/call`` result with the default policy in ``flag`` mode; a sample is flagged when any ``injection:*``
count is reported. Figures are printed per split, per injection family and obfuscation, and per benign kind.
Splits: ``dev`` and ``test`` (the first corpus; both were visible while the detector was tuned), ``holdout``
(written after that tuning; its first-run figures are in docs/security.md, it was tuned on afterwards) and
``fresh`` (written after the second round of tuning and never tuned on: the honest generalisation figure).
The cost section times ``InjectionDetector.scan`` alone
on the benign corpus and on a 100 KB log, in CPU microseconds per KB.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_sanitize import log_text
from tests.sanitize.corpus import evaluate, flagged, load

from bastion.sanitize.injection import InjectionDetector


def breakdown() -> None:
    from bastion.sanitize.config import SanitizeConfig

    policy = SanitizeConfig.from_mapping({}).default
    by: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for row in load("injection"):
        key = f"injection  {row.get('obfuscation') or row['family']}"
        by[key][0] += 1
        by[key][1] += bool(flagged(row["text"], policy))
    for row in load("benign"):
        key = f"benign     {row['kind']}"
        by[key][0] += 1
        by[key][1] += bool(flagged(row["text"], policy))
    print(f"\n{'group':40} {'samples':>8} {'flagged':>8}")
    for key in sorted(by):
        print(f"{key:40} {by[key][0]:>8} {by[key][1]:>8}")


def cost(seconds: float) -> None:
    import random

    detector = InjectionDetector()
    texts = [row["text"] for row in load("benign")]
    size = sum(len(t.encode()) for t in texts)
    log = log_text(100_000, random.Random(7))
    print(f"\n{'detector cost (scan only)':40} {'KB':>8} {'us/KB':>8} {'us/call':>9}")
    for name, batch, kb in (("benign corpus, per sample", texts, size / 1024),
                            ("100 KB log text", [log], len(log) / 1024)):
        for text in batch:  # warm up: RE2 builds its DFA states lazily on first use
            detector.scan(text)
        n = 0
        start = time.process_time()  # CPU time: the figure that matters, and less disturbed by a busy machine
        while (elapsed := time.process_time() - start) < seconds:
            for text in batch:
                detector.scan(text)
            n += 1
        per_round = elapsed / n * 1e6
        print(f"{name:40} {kb:>8.1f} {per_round / kb:>8.2f} {per_round / len(batch):>9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--verbose", action="store_true", help="list missed injections and false positives")
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"{'split':8} {'injections':>10} {'recall':>8} {'benign':>8} {'FP':>4} {'FP rate':>8}")
    for split in ("dev", "test", "holdout", "fresh", None):
        score = evaluate(split)
        print(f"{split or 'all':8} {score.injections:>10} {score.recall:>8.1%} {score.benign:>8} "
              f"{score.false_positives:>4} {score.fp_rate:>8.1%}")
        if args.verbose and split is None:
            for row in score.misses:
                print(f"  MISS {row['file']} [{row.get('obfuscation') or row['family']}] {row['text'][:150]!r}")
            for row, hits in score.fps:
                print(f"  FP   {row['file']} [{row['kind']}] {sorted(hits)} {row['text'][:150]!r}")
    breakdown()
    cost(args.seconds)


if __name__ == "__main__":
    main()
