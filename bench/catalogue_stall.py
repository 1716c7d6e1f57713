"""Do other clients' calls keep their latency while bastion rebuilds a huge catalogue?

    python bench/catalogue_stall.py --tools 50000 --duration 20
    python bench/catalogue_stall.py --big-description 30000000 --duration 20
    python bench/catalogue_stall.py --tools 50000 --limits raised   # every tool through merge/compile/pin
    python bench/catalogue_stall.py --tools 50000 --src /tmp/main/src --limits none   # another bastion tree

Starts the fast upstream (``upstream_fast.py``) and two gateways in turn, on free loopback ports: ``quiet`` with
the fast upstream alone, and ``flooded`` with the fast upstream plus ``tests.fixtures.huge_catalogue_server``
(stdio), which lists ``--tools`` tools (and a ``--big-description`` of that many bytes) and changes one definition
on every listing, so every periodic refresh (``--refresh``, default 2 s) re-fetches, merges, compiles, sanitizes
and pins the whole catalogue. Meanwhile ``--concurrency`` sessions call ``fast__echo`` (a tool of the *other*
upstream) in a closed loop; the table shows their latency percentiles and how many refreshes ran in the window.

``--limits`` chooses the catalogue limits: ``default`` (bastion's defaults), ``raised`` (high enough that nothing
is dropped, to measure the rebuild itself), ``none`` (no ``catalogue.limits`` key, for trees that predate it).
``--src`` runs the bastion package from another source tree (e.g. an extracted ``main``) for before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from loadgen import REPO, McpSession, Result, cpu_seconds, free_port, machine_summary, running, stop, wait_ready

RAISED = {"max_tools": 1_000_000, "max_definition_size": "64MiB", "max_schema_size": "64MiB",
          "max_list_size": "1GiB"}


def config(port: int, fast_url: str, huge: list[str] | None, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    upstreams: dict[str, Any] = {"fast": {"url": fast_url, "era": "legacy"}}
    if huge is not None:
        upstreams["huge"] = {"command": [sys.executable, "-m", "tests.fixtures.huge_catalogue_server", *huge],
                             "cwd": str(REPO), "era": "legacy", "timeout": "120s"}
    catalogue: dict[str, Any] = {"refresh_interval": args.refresh}
    if args.limits == "raised":
        catalogue["limits"] = RAISED
    return {"listen": {"host": "127.0.0.1", "port": port}, "auth": "none", "upstreams": upstreams,
            "catalogue": catalogue, "pinning": {"file": str(work / f"pins-{port}.json")},
            "logging": {"format": "json", "level": "info"}}


def run(label: str, fast_url: str, huge: list[str] | None, args: argparse.Namespace, work: Path) -> Result:
    port = free_port()
    path = work / f"bastion-{port}.yaml"
    path.write_text(yaml.safe_dump(config(port, fast_url, huge, args, work), sort_keys=False))
    log = work / f"bastion-{port}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.src), str(REPO)])}
    proc = subprocess.Popen([sys.executable, "-m", "bastion", "serve", "--config", str(path)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", proc, log, timeout=args.start_timeout)
        before = log.read_text(errors="replace").count("catalogue.published")
        result = asyncio.run(measure(f"http://127.0.0.1:{port}/mcp", proc.pid, args))
        refreshes = log.read_text(errors="replace").count("catalogue.published") - before
        return Result(label=f"{label} ({refreshes} refreshes)", calls=result.calls, errors=result.errors,
                      elapsed=result.elapsed, latencies_ms=result.latencies_ms, cpu_s=result.cpu_s,
                      loadgen_cpu_s=result.loadgen_cpu_s, first_error=result.first_error)
    finally:
        stop(proc)


async def measure(url: str, pid: int, args: argparse.Namespace) -> Result:
    """Closed-loop calls to ``fast__echo``; every call *started* in the window counts, however long it takes.

    (A stall is the point here: a call that waits out a whole refresh must be in the figures even when it
    returns after the window closed, so the window waits for the calls in flight, up to ``--drain`` seconds;
    one still pending then counts with the time it had waited.)
    """
    latencies: list[float] = []
    errors = 0
    sessions = [McpSession(url) for _ in range(args.concurrency)]
    await asyncio.gather(*(s.open() for s in sessions))
    loop = asyncio.get_running_loop()
    await asyncio.sleep(args.warmup)
    cpu0, start = cpu_seconds(pid), loop.time()
    end = start + args.duration

    async def worker(session: McpSession) -> None:
        nonlocal errors
        while loop.time() < end:
            t0 = loop.time()
            try:
                failed = await asyncio.wait_for(session.call("fast__echo", {"text": "hi"}),
                                                end + args.drain - t0)
            except TimeoutError:
                latencies.append((loop.time() - t0) * 1000)
                errors += 1
                return
            latencies.append((loop.time() - t0) * 1000)
            errors += failed is not None

    await asyncio.gather(*(worker(s) for s in sessions))
    elapsed = loop.time() - start
    cpu = cpu_seconds(pid) - cpu0
    for s in sessions:
        await s.close()
    return Result(label="", calls=len(latencies), errors=errors, elapsed=elapsed, latencies_ms=latencies,
                  cpu_s={"gateway": cpu}, loadgen_cpu_s=0.0)


def table(results: list[Result]) -> str:
    rows = ["| gateway | calls/s | p50 ms | p99 ms | max ms | gateway CPU s |", "|---|---|---|---|---|---|"]
    for r in results:
        worst = max(r.latencies_ms) if r.latencies_ms else float("nan")
        rows.append(f"| {r.label} | {r.rate:.0f} | {r.percentile(50):.2f} | {r.percentile(99):.2f} | {worst:.1f} "
                    f"| {r.cpu_s.get('gateway', 0.0):.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tools", type=int, default=50_000)
    parser.add_argument("--big-description", type=int, default=0)
    parser.add_argument("--limits", choices=["default", "raised", "none"], default="default")
    parser.add_argument("--refresh", default="2s", help="catalogue.refresh_interval of the flooded gateway")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--drain", type=float, default=120.0, help="how long to wait for calls in flight")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the bastion source tree to run")
    parser.add_argument("--skip-quiet", action="store_true")
    args = parser.parse_args(argv)
    huge = ["--tools", str(args.tools), "--vary"]
    if args.big_description:
        huge += ["--big-description", str(args.big_description)]
    results = []
    with tempfile.TemporaryDirectory(prefix="bastion-stall-") as tmp:
        work = Path(tmp)
        fast_port = free_port()
        with running([sys.executable, str(REPO / "bench" / "upstream_fast.py"), "--port", str(fast_port)],
                     port=fast_port):
            fast_url = f"http://127.0.0.1:{fast_port}/mcp"
            if not args.skip_quiet:
                results.append(run("quiet", fast_url, None, args, work))
            results.append(run("flooded", fast_url, huge, args, work))
    print(machine_summary())
    print(f"huge upstream: {' '.join(huge)}; limits: {args.limits}; src: {args.src}")
    print(table(results))
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
