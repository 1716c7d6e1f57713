"""What one audit record costs through ``AuditLog`` and the file sink, at a given concurrency.

    python bench/bench_audit.py                         # c=1 and c=32, 20000 records each, fsync off and on
    python bench/bench_audit.py --n 50000 --concurrency 32 --no-fsync
    python bench/bench_audit.py --loop uvloop --no-fsync   # on the event loop the gateway runs

Each of ``--concurrency`` tasks emits records back to back (each waits for its own record, as a call does).
Prints, per record: CPU of the whole process (event loop and writer thread), CPU of the event loop's thread
alone, and how many records went over to the writer thread per hand-off where the sink exposes it. To compare
with another checkout, run it with that checkout's ``src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import uvloop

from bastion.audit.log import AuditLog
from bastion.audit.sinks import FileSink


def record(i: int) -> dict[str, object]:
    # About the size of a real tool.call record (~900 bytes of JSON).
    return {"schema_version": 1, "kind": "audit", "time": "2026-03-01T12:00:00.123Z", "event": "tool.call",
            "request_id": i, "session": "5f1c" * 10, "era": "legacy",
            "principal": {"id": "alice", "groups": ["eng"], "auth_method": "api_key"},
            "client": {"name": "bench", "version": "1"}, "trace": None, "call_id": f"{i:016x}",
            "tool": {"name": "fast__echo", "upstream": "fast", "original": "echo"}, "decision": "allow",
            "outcome": "allowed", "stage": "complete", "rule_id": "allow-all", "reason": None, "limit": None,
            "violations": [], "shadow_denies": [], "sanitize": {}, "error": None,
            "arguments_digest": "sha256:" + "9b1f" * 16,
            "result": {"is_error": False, "content_types": ["text"], "content_items": 1, "bytes": 120,
                       "structured": True},
            "latency_ms": {"total": 0.412, "upstream": 0.2, "overhead": 0.212}}


async def run(n: int, concurrency: int, fsync: bool, directory: Path) -> dict[str, float]:
    sink = FileSink(directory / f"audit-{concurrency}-{fsync}.jsonl", fsync=fsync, max_bytes=0)
    audit = AuditLog([sink])

    async def worker(count: int, base: int) -> None:
        for i in range(count):
            await audit.emit(record(base + i))

    await worker(200, -200)  # warm-up
    writer = getattr(sink, "writer", None)
    batches0 = writer.batches if writer is not None else 0
    share = n // concurrency
    cpu0, loop0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
    await asyncio.gather(*(worker(share, k * share) for k in range(concurrency)))
    cpu, loop_cpu, wall = time.process_time() - cpu0, time.thread_time() - loop0, time.perf_counter() - wall0
    batches = (writer.batches - batches0) if writer is not None else 0
    await audit.close()
    done = share * concurrency
    return {"cpu_us": cpu / done * 1e6, "loop_us": loop_cpu / done * 1e6, "rate": done / wall,
            "per_batch": done / batches if batches else 1.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, action="append", help="repeatable (default: 1 and 32)")
    parser.add_argument("--no-fsync", action="store_true", help="only fsync: false")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                        help="event loop (the gateway runs uvloop; default: asyncio)")
    args = parser.parse_args()
    levels = args.concurrency or [1, 32]
    modes = [False] if args.no_fsync else [False, True]
    print(f"{'fsync':>5} {'c':>4} {'CPU us/rec':>10} {'loop us/rec':>11} {'rec/s':>9} {'rec/hand-off':>12}")
    with tempfile.TemporaryDirectory(prefix="bastion-bench-audit-") as tmp:
        for fsync in modes:
            for c in levels:
                n = args.n if not fsync else max(c * 50, args.n // 10)
                r = (uvloop.run if args.loop == "uvloop" else asyncio.run)(run(n, c, fsync, Path(tmp)))
                print(f"{fsync!s:>5} {c:>4} {r['cpu_us']:>10.1f} {r['loop_us']:>11.1f} {r['rate']:>9.0f} "
                      f"{r['per_batch']:>12.1f}")


if __name__ == "__main__":
    main()
