"""What one timed await costs: ``asyncio.timeout`` against ``bastion.deadlines.Deadlines``, in CPU microseconds.

    python bench/bench_timeouts.py [--n 200000] [--loop uvloop|asyncio]

Each variant wraps an await that finishes at once (the common case on the tools/call path: the upstream, the
limiter's script, the session store answer long before their deadlines) in a timed block, ``--n`` times in a row,
and reports CPU time per block (``time.process_time``), best of three runs, with the bare await's own cost
subtracted. The loop is the gateway's (uvloop) unless ``--loop asyncio``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import uvloop

from bastion.deadlines import Deadlines


async def _nothing() -> None:
    return None


async def bare(n: int) -> None:
    for _ in range(n):
        await _nothing()


async def with_asyncio_timeout(n: int) -> None:
    for _ in range(n):
        async with asyncio.timeout(30):
            await _nothing()


async def with_deadlines(n: int) -> None:
    deadlines = Deadlines()
    for _ in range(n):
        with deadlines.after(30):
            await _nothing()


def best_of_three(run: Callable[[Callable[[int], Awaitable[None]], int], float],
                  variant: Callable[[int], Awaitable[None]], n: int) -> float:
    return min(run(variant, n) for _ in range(3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()

    def run(variant: Callable[[int], Awaitable[None]], n: int) -> float:
        async def timed() -> float:
            started = time.process_time()
            await variant(n)
            return time.process_time() - started
        result: float = uvloop.run(timed()) if args.loop == "uvloop" else asyncio.run(timed())
        return result

    base = best_of_three(run, bare, args.n)
    print(f"loop: {args.loop}, {args.n} timed awaits per run, best of three, the bare await subtracted")
    print("| variant | CPU µs per timed await |")
    print("|---|---:|")
    for label, variant in (("asyncio.timeout", with_asyncio_timeout), ("Deadlines.after", with_deadlines)):
        cost = best_of_three(run, variant, args.n)
        print(f"| {label} | {(cost - base) / args.n * 1e6:.2f} |")


if __name__ == "__main__":
    main()
