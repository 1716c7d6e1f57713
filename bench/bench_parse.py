"""Front-door parse cost: ``bastion.jsonrpc.parse`` (strict decoder + flaw scan) against plain ``orjson.loads``.

    python bench/bench_parse.py [--seconds 1.0]

Per body: microseconds per parse for both, and the overhead of the strict checks. Bodies: a typical small
tools/call, a 100 KB one, a 3 MB one with full-precision floats (which triggers the exact-number scan), one with
many brackets (which triggers the depth walk), and a rejected body nested 3000 levels (which is cut at the limit).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import string
import time
from collections.abc import Callable

import orjson

from bastion import jsonrpc
from bastion.errors import MessageRejected


def call(arguments: object) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                         "params": {"name": "files__read_file", "arguments": arguments}})


def bodies() -> dict[str, bytes]:
    rnd = random.Random(1)
    words = ["".join(rnd.choices(string.ascii_letters, k=12)) for _ in range(2000)]
    return {
        "small tools/call (90 B)": call({"path": "/srv/projects/readme.md"}),
        "100 KB of strings": call({"lines": words[:1000] * 8}),
        "3 MB, floats and ints": call({"rows": [{"a": rnd.random(), "b": rnd.choice(words), "c": rnd.randint(0, 10**12)}
                                                for _ in range(40_000)]}),
        "100 KB of small objects": call({"items": [{"k": i, "v": [i, i + 1]} for i in range(6000)]}),
        "rejected: 3000 levels deep": (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x",'
                                       b'"arguments":{"a":' + b"[" * 3000 + b"]" * 3000 + b"}}}"),
    }


def per_call_us(fn: Callable[[], object], seconds: float) -> float:
    fn()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        count += 1
    return (time.perf_counter() - start) / count * 1e6


def strict(body: bytes) -> None:
    with contextlib.suppress(MessageRejected):
        doc = jsonrpc.parse(body)
        jsonrpc.classify(doc.value, doc.flaw(doc.value))


def plain(body: bytes) -> None:
    with contextlib.suppress(orjson.JSONDecodeError, MessageRejected):
        jsonrpc.classify(orjson.loads(body))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    print(f"{'body':32} {'bytes':>9} {'orjson+classify µs':>19} {'strict µs':>11} {'overhead':>9}")
    for name, body in bodies().items():
        base = per_call_us(lambda b=body: plain(b), args.seconds)
        full = per_call_us(lambda b=body: strict(b), args.seconds)
        print(f"{name:32} {len(body):>9} {base:>19.1f} {full:>11.1f} {full / base:>8.2f}x")


if __name__ == "__main__":
    main()
