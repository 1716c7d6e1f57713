"""What the rate limiter costs per tools/call: one Redis round trip (1 and 3 limits), a lease, and in memory.

    python bench/bench_limiter.py                       # starts its own redis-server on a free loopback port
    python bench/bench_limiter.py --redis-url redis://127.0.0.1:6379/0 --n 20000 --concurrency 16

Each scenario runs a bounded loop of ``--n`` decisions (after a warm-up), split over ``--concurrency`` asyncio
tasks, every decision admitted (the budget is far larger than ``--n``) so the full write path is measured.
Prints ops/s and the p50/p99 latency of one decision as seen by its caller.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from redis.asyncio import Redis

from bastion.ratelimit.gcra import RateCheck
from bastion.ratelimit.limiter import CapCheck, Limiter
from bastion.ratelimit.memory import MemoryLimiter
from bastion.ratelimit.model import Rate, RateLimitSpec
from bastion.ratelimit.redis_limiter import RedisLimiter

Op = Callable[[], Awaitable[object]]


def checks(n: int, ns: str) -> list[RateCheck]:
    spec = [RateLimitSpec(name=f"l{i}", scope="global", rate=Rate(10**9, 3600.0)) for i in range(n)]
    return [RateCheck.from_spec(s, f"{s.name}:{ns}") for s in spec]


async def measure(op: Op, n: int, concurrency: int) -> tuple[float, float, float]:
    for _ in range(min(200, n)):
        await op()
    latencies: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            t0 = time.perf_counter_ns()
            await op()
            latencies.append((time.perf_counter_ns() - t0) / 1000)

    share = n // concurrency
    start = time.perf_counter()
    await asyncio.gather(*(worker(share) for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    return len(latencies) / elapsed, q[49], q[98]


def scenarios(limiter: Limiter, kind: str, ns: str) -> list[tuple[str, Op]]:
    one, three = checks(1, ns), checks(3, ns)

    async def lease() -> None:
        async with limiter.lease([CapCheck(name="cap", key=f"cap:{ns}", max=10**6)]):
            pass

    return [(f"{kind}: check, 1 limit", lambda: limiter.check(one)),
            (f"{kind}: check, 3 limits", lambda: limiter.check(three)),
            (f"{kind}: lease acquire+release", lease)]


@contextmanager
def own_redis() -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found; install it or pass --redis-url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", workdir], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


async def run(url: str, n: int, concurrency: int) -> None:
    client = Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    info = await client.info("server")
    ns = uuid.uuid4().hex[:8]
    redis_limiter = RedisLimiter(client, key_prefix=f"bench:{ns}", timeout_s=1.0)
    await redis_limiter.load_scripts()

    async def nothing() -> None:
        return None

    rows: list[tuple[str, Op]] = [("baseline: no limiter", nothing)]
    rows += scenarios(MemoryLimiter(), "memory", ns)
    rows += scenarios(redis_limiter, "redis", ns)
    print(f"redis {info['redis_version']}, n={n}, concurrency={concurrency}")
    print(f"{'scenario':34} {'ops/s':>10} {'p50 us':>9} {'p99 us':>9}")
    for name, op in rows:
        ops, p50, p99 = await measure(op, n, concurrency)
        print(f"{name:34} {ops:10.0f} {p50:9.1f} {p99:9.1f}")
    async for key in client.scan_iter(match=f"bench:{ns}:*"):
        await client.delete(key)
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    parser.add_argument("--n", type=int, default=20000, help="decisions per scenario")
    parser.add_argument("--concurrency", type=int, default=1, help="asyncio tasks sharing the loop")
    args = parser.parse_args()
    if args.redis_url:
        asyncio.run(run(args.redis_url, args.n, args.concurrency))
        return
    with own_redis() as url:
        asyncio.run(run(url, args.n, args.concurrency))


if __name__ == "__main__":
    main()
