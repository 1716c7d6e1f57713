"""Sanitizer throughput (MB/s) and cost per call on realistic tools/call results.

    python bench/bench_sanitize.py [--seconds 1.0] [--cpu]

Each scenario sanitizes one result repeatedly with the default policy (the guard's hot path, without the event
loop) and reports input MB/s and microseconds per call. ``--cpu`` measures CPU time (``time.process_time``) instead
of wall-clock time and reports the best of five runs of ``--seconds`` / 5 each: on a shared machine, the figure to
compare before and after a change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import time
import uuid
from typing import Any

from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.result import sanitize_result

WORDS = ("the", "request", "returned", "status", "code", "with", "latency", "for", "user", "service", "deploy",
         "build", "error", "warning", "info", "config", "value", "update", "cache", "miss", "hit", "retry",
         "connection", "timeout", "file", "path", "line", "column")


def log_text(size: int, rng: random.Random) -> str:
    lines = []
    total = 0
    while total < size:
        line = (f"2025-06-01T12:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z INFO "
                + " ".join(rng.choice(WORDS) for _ in range(12)))
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:size]


def scenarios() -> dict[str, dict[str, Any]]:
    rng = random.Random(7)
    plain = log_text(100_000, rng)
    rows = [{"id": i, "name": f"item-{i}", "owner": rng.choice(WORDS), "tags": [rng.choice(WORDS) for _ in range(3)],
             "score": rng.random()} for i in range(900)]
    structured = {"rows": rows, "total": len(rows)}
    # A directory listing as a tool returns it: ids, hashes, a role column whose values are role words. Its own
    # generator, so that the other scenarios stay what they were before it was added.
    table_rng = random.Random(11)
    users = [{"id": str(uuid.UUID(int=table_rng.getrandbits(128))), "email": f"user{i}@example.com",
              "role": table_rng.choice(("admin", "user", "viewer")), "sha256": hashlib.sha256(b"%d" % i).hexdigest(),
              "created": f"2026-11-{1 + i % 28:02d}T10:00:00Z", "active": True, "score": table_rng.random()}
             for i in range(1000)]
    table = {"users": users, "count": len(users)}
    secrets = [" AKIAIOSFODNN7EXAMPLE ", " ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1 ",
               " postgres://app:S3cr3tPassw0rd@db:5432/app ", ' password="Xk9mQ2vL8pR4tZ7w" ']
    with_secrets = "".join(chunk + rng.choice(secrets) for chunk in (log_text(2_000, rng) for _ in range(50)))
    unicode_heavy = "".join(rng.choice(("日本語のテキスト、", "Grüße aus Köln — ", "Привет, мир! ", "😀 ✓ ", "مرحبا "))
                            for _ in range(8_000))
    return {
        "plain ASCII text 100 KB": {"content": [{"type": "text", "text": plain}]},
        "JSON structured + mirror": {"content": [{"type": "text", "text": json.dumps(structured)}],
                                     "structuredContent": structured},
        "JSON table: 1,000 users + mirror": {"content": [{"type": "text", "text": json.dumps(table)}],
                                             "structuredContent": table},
        "text with secrets 100 KB": {"content": [{"type": "text", "text": with_secrets}]},
        "unicode-heavy text": {"content": [{"type": "text", "text": unicode_heavy}]},
        "hostile text (escapes, bidi, tags)": {"content": [{"type": "text", "text": (
            "\x1b[31mok\x1b[0m \u202eabc\u202c \u200b" + "".join(chr(0xE0000 + ord(c)) for c in "hidden ") + plain[:200]
        ) * 300}]},
        "small call (1 KB text)": {"content": [{"type": "text", "text": plain[:1000]}]},
    }


def size_of(result: dict[str, Any]) -> int:
    total = sum(len(b["text"].encode()) for b in result["content"])
    if "structuredContent" in result:
        total += len(json.dumps(result["structuredContent"]).encode())
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--cpu", action="store_true", help="CPU time, best of five runs")
    args = parser.parse_args()
    policy = SanitizeConfig.from_mapping({}).default
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.platform()}")
    print(f"{'scenario':38} {'bytes':>9} {'MB/s':>9} {'us/call':>10}")
    for name, result in scenarios().items():
        sanitize_result(result, policy)  # warm up
        clock = time.process_time if args.cpu else time.perf_counter
        runs = 5 if args.cpu else 1
        per_call = float("inf")
        for _ in range(runs):
            n = 0
            start = clock()
            while (spent := clock() - start) < args.seconds / runs:
                sanitize_result(result, policy)
                n += 1
            per_call = min(per_call, spent / n)
        size = size_of(result)
        print(f"{name:38} {size:>9} {size / per_call / 1e6:>9.1f} {per_call * 1e6:>10.1f}")


if __name__ == "__main__":
    main()
