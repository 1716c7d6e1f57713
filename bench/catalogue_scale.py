"""The catalogue at scale: what building a big merged catalogue costs, and what listing it from the cache costs.

    python bench/catalogue_scale.py                          # 20 upstreams x 100 tools, pages of 500
    python bench/catalogue_scale.py --upstreams 5 --tools 10 --duration 1   # a quick look
    python bench/catalogue_scale.py --cases none --profile /tmp/prof       # where the listing's CPU goes

One ``upstream_fast.py --tools N`` process lists N tools of about 1.3 KB each (``echo`` and generated ones, half
``*_read``, half ``*_write``); the gateway has ``--upstreams`` HTTP upstreams pointing at it (``u00``, ``u01``, ...),
so its catalogue holds ``upstreams x tools`` distinct public tools. Callers authenticate with an API key, so there
is a principal to filter for. Each case starts a fresh gateway (empty pin store) and measures:

- **build**: the gateway's CPU time from its start until its log says a catalogue with every tool was published
  (and ``/readyz`` answers 200). Start-up costs that do not depend on the catalogue (imports, connecting the
  upstreams) are measured the same way on a gateway whose upstreams list one tool each, and subtracted: what
  remains, divided by the extra tools, is the build's CPU per tool;
- **listing**: one session lists every tool (``tools/list`` and its ``nextCursor`` pages) in a closed loop, c=1,
  for ``--duration`` seconds after ``--warmup``: the gateway's CPU per full listing, and its latency p50/p99.

Cases: ``none`` (no policy: every tool is visible) and ``half`` (a policy allowing the caller the ``*_read``
tools only, half of the catalogue). The load generator and the servers are pinned apart as in ``sidebyside.py``.

``--profile DIR`` runs each gateway under cProfile switched on for the measured listing phase only (by SIGUSR1
and SIGUSR2, so the build and the warm-up stay out of it) and writes ``DIR/<case>-<round>.prof`` (read it with
``python -m pstats``). The profiler slows Python code down, so the CPU figures of a profiled run are not comparable.

``--raw`` measures the listings on a socket of their own, replaying the first listing's requests and reading the
answers without decoding them: the load generator decodes 2.6 MB per listing in Python, which dominates the
latency of a decoded listing (it is the client's time, not the gateway's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from harness import ApiKey, Cpus, bastion_command, commit, started, write_config
from loadgen import BENCH, BenchError, McpSession, cpu_seconds, free_port, machine_summary, wait_ready

CASES = ("none", "half")
KEY_ID = "bench"
PUBLISHED = re.compile(rb'"tools":\s*(\d+)')
QUIET_WINDOW = 1.0  # seconds
QUIET_SHARE = 0.03  # of one CPU: the health probes and timers of an idle gateway stay well under it

# The gateway under a profiler that only runs between SIGUSR1 (start) and SIGUSR2 (stop and write argv[1]).
# Signal handlers run on the main thread between bytecodes, i.e. inside the event loop, so nothing is lost.
PROFILED_GATEWAY = """
import cProfile, signal, sys
out, profiler = sys.argv.pop(1), cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
def _stop(*_):
    profiler.disable()
    profiler.dump_stats(out)
signal.signal(signal.SIGUSR2, _stop)
from bastion.cli import main
sys.exit(main())
"""


@dataclass(frozen=True)
class Build:
    """CPU seconds and wall seconds of a gateway's start, to the full catalogue and to quiet."""

    cpu_s: float  # when the log first reports a catalogue with every tool
    wall_s: float
    settled_cpu_s: float  # when the gateway stopped using CPU afterwards (a build may go on after a publish)
    settled_wall_s: float
    publishes: int  # catalogue.published lines by then


@dataclass(frozen=True)
class Listing:
    listings: int
    errors: int
    cpu_s: float
    latencies_ms: Sequence[float]
    tools_seen: int
    pages: int
    mean_tool_bytes: float

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else float("nan")


def gateway_config(*, port: int, upstream_url: str, upstreams: int, page_size: int, key: ApiKey, work: Path,
                   policy: str) -> dict[str, Any]:
    """Pure: one gateway's config for a case (``policy`` is ``none`` or ``half``)."""
    doc: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "auth": {"api_keys": [dict(key.entry)]},
        "upstreams": {f"u{i:02d}": {"url": upstream_url} for i in range(upstreams)},
        "catalogue": {"page_size": page_size},
        # A fresh pin store per gateway: every tool is pinned for the first time, as in a new deployment.
        "pinning": {"file": str(work / f"pins-{port}.json")},
        "audit": {"sinks": [{"file": str(work / f"audit-{port}.jsonl")}]},
        "logging": {"format": "json", "level": "info"},
    }
    if policy == "half":
        policies = work / "policies-half"
        policies.mkdir(exist_ok=True)
        write_config(policies / "half.yaml", {"version": 1, "rules": [
            {"id": "bench-reads-only", "effect": "allow", "description": "The caller may use the read tools.",
             "principals": {"ids": [KEY_ID]}, "tools": ["*_read"]}]})
        doc["policies"] = str(policies)
    elif policy != "none":
        raise BenchError(f"unknown policy case {policy!r}")
    return doc


def published_tools(log: bytes) -> list[int]:
    """The tool count of every ``catalogue.published`` line of the gateway's JSON log, in order."""
    return [int(m.group(1)) for line in log.splitlines() if b"catalogue.published" in line
            for m in [PUBLISHED.search(line)] if m]


def wait_built(proc: Any, log: Path, expected: int, started_at: float, timeout: float) -> Build:
    """Poll the log file (which costs the gateway nothing) until the whole catalogue is published, then the
    gateway's CPU time until it has been quiet (under ``QUIET_SHARE`` of a CPU) for ``QUIET_WINDOW`` seconds."""
    deadline = time.monotonic() + timeout

    def check() -> None:
        if proc.poll() is not None:
            raise BenchError(f"gateway exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            raise BenchError(f"no quiet catalogue of {expected} tools after {timeout:.0f} s:\n"
                             f"{log.read_text(errors='replace')[-3000:]}")

    while max(published_tools(log.read_bytes()), default=0) < expected:
        check()
        time.sleep(0.02)
    cpu, wall = cpu_seconds(proc.pid), time.perf_counter() - started_at
    last_cpu, last_wall = cpu, wall
    while True:
        check()
        time.sleep(QUIET_WINDOW)
        now_cpu, now_wall = cpu_seconds(proc.pid), time.perf_counter() - started_at
        if now_cpu - last_cpu < QUIET_SHARE * (now_wall - last_wall):
            break
        last_cpu, last_wall = now_cpu, now_wall
    return Build(cpu_s=cpu, wall_s=wall, settled_cpu_s=last_cpu, settled_wall_s=last_wall,
                 publishes=len(published_tools(log.read_bytes())))


async def list_everything(session: McpSession) -> tuple[list[dict[str, Any]], int]:
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    pages = 0
    while True:
        message = await session.request("tools/list", {} if cursor is None else {"cursor": cursor})
        if "result" not in message:
            raise BenchError(f"tools/list failed: {message.get('error')}")
        pages += 1
        tools.extend(message["result"]["tools"])
        cursor = message["result"].get("nextCursor")
        if not cursor:
            return tools, pages


class RawListing:
    """A full listing replayed on a keep-alive socket of its own: the same requests (same ids and cursors) every
    time, each answer read to its ``Content-Length`` and not decoded, so a listing's latency is the gateway's
    and the wire's, not the load generator's JSON decoding of 2.6 MB. Equal answers have equal sizes: a listing
    whose size differs from the first one's counts as an error."""

    def __init__(self, url: str, headers: Mapping[str, str], cursors: Sequence[str | None]) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.requests = []
        for i, cursor in enumerate(cursors):
            body = orjson.dumps({"jsonrpc": "2.0", "id": f"raw-{i}", "method": "tools/list",
                                 "params": {} if cursor is None else {"cursor": cursor}})
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            self.requests.append(f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}"
                                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        self.size: int | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        self.writer.close()
        with suppress(ConnectionError):
            await self.writer.wait_closed()

    async def list_everything(self) -> bool:
        """One full listing; True if its answers had the size of the first listing's."""
        size = 0
        for request in self.requests:
            self.writer.write(request)
            head = await self.reader.readuntil(b"\r\n\r\n")
            found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if not head.startswith(b"HTTP/1.1 200 ") or found is None:
                raise BenchError(f"tools/list answered {head[:200]!r}")
            size += len(await self.reader.readexactly(int(found.group(1))))
        if self.size is None:
            self.size = size
        return size == self.size


async def load_listings(url: str, headers: Mapping[str, str], pid: int, expected: int, *, duration: float,
                        warmup: float, profile: bool = False, raw: bool = False) -> Listing:
    session = McpSession(url, headers)
    await session.open()
    replay: RawListing | None = None
    try:
        tools, pages = await list_everything(session)
        mean = sum(len(orjson.dumps(t)) for t in tools) / len(tools) if tools else 0.0
        if raw:
            cursors: list[str | None] = [None]
            while len(cursors) < pages:
                page = await session.request("tools/list", {} if cursors[-1] is None else {"cursor": cursors[-1]})
                cursors.append(page["result"]["nextCursor"])
            replay = RawListing(url, session.headers, cursors)
            await replay.open()
            await replay.list_everything()

        async def listing() -> bool:
            if replay is not None:
                return await replay.list_everything()
            seen, _ = await list_everything(session)
            return len(seen) == expected

        end_warmup = time.perf_counter() + warmup
        while time.perf_counter() < end_warmup:
            await listing()
        latencies: list[float] = []
        errors = 0
        if profile:
            os.kill(pid, signal.SIGUSR1)
            await asyncio.sleep(0.05)  # delivered and handled before the first measured request
        cpu0 = cpu_seconds(pid)
        end = time.perf_counter() + duration
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                errors += not await listing()
            except BenchError:
                errors += 1
            latencies.append((time.perf_counter() - t0) * 1000)
        cpu = cpu_seconds(pid) - cpu0
        if profile:
            os.kill(pid, signal.SIGUSR2)
            await asyncio.sleep(0.5)  # written before the gateway is stopped
    finally:
        if replay is not None:
            await replay.close()
        await session.close()
    return Listing(listings=len(latencies), errors=errors, cpu_s=cpu, latencies_ms=latencies,
                   tools_seen=len(tools), pages=pages, mean_tool_bytes=mean)


def run_gateway(work: Path, cpus: Cpus, *, name: str, upstream_url: str, args: argparse.Namespace, key: ApiKey,
                policy: str, tools_per_upstream: int, listing: bool,
                profile: Path | None = None) -> tuple[Build, Listing | None]:
    port = free_port()
    config = write_config(work / f"{name}-{port}.yaml", gateway_config(
        port=port, upstream_url=upstream_url, upstreams=args.upstreams, page_size=args.page_size, key=key,
        work=work, policy=policy))
    log = work / f"{name}-{port}.log"
    expected = args.upstreams * tools_per_upstream
    print(f"{name}: starting a gateway with {expected} tools ...", file=sys.stderr, flush=True)
    started_at = time.perf_counter()
    command = bastion_command(config)
    if profile is not None:
        command = [command[0], "-c", PROFILED_GATEWAY, str(profile), *command[3:]]  # in place of "-m bastion"
    with started(command, cpus=cpus, log=log) as proc:
        build = wait_built(proc, log, expected, started_at, args.start_timeout)
        wait_ready(f"http://127.0.0.1:{port}/readyz", proc, log)
        result = None
        if listing:
            # upstream_fast.py names its odd-numbered generated tools *_read: tools // 2 of each upstream's.
            visible = expected if policy == "none" else args.upstreams * (tools_per_upstream // 2)
            result = asyncio.run(load_listings(f"http://127.0.0.1:{port}/mcp", key.headers, proc.pid, visible,
                                               duration=args.duration, warmup=args.warmup,
                                               profile=profile is not None, raw=args.raw))
    return build, result


@dataclass(frozen=True)
class Row:
    case: str
    build: Build
    baseline: Build
    extra_tools: int
    listing: Listing


def table(rows: Sequence[Row]) -> str:
    """Build figures are the gateway's CPU from its start, minus the same start with one tool per upstream, divided
    by the extra tools: to the first publish of the full catalogue, and to quiet (everything the build caused)."""
    out = ["| policy | tools visible | pages | start-up CPU s, 1 tool/upstream | CPU s to full catalogue | "
           "build CPU ms/tool | CPU s to quiet | build-to-quiet CPU ms/tool | publishes | wall s to full / quiet | "
           "listing CPU ms | listing p50 ms | listing p99 ms | listings | errors |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lst, b = r.listing, r.build
        per_tool = (b.cpu_s - r.baseline.cpu_s) * 1000 / r.extra_tools
        settled_per_tool = (b.settled_cpu_s - r.baseline.settled_cpu_s) * 1000 / r.extra_tools
        per_listing = lst.cpu_s * 1000 / lst.listings if lst.listings else float("nan")
        label = "none (all tools)" if r.case == "none" else "half (`*_read` only)"
        out.append(f"| {label} | {lst.tools_seen:,} | {lst.pages} | {r.baseline.settled_cpu_s:.2f} | {b.cpu_s:.2f} | "
                   f"{per_tool:.2f} | {b.settled_cpu_s:.2f} | {settled_per_tool:.2f} | {b.publishes} | "
                   f"{b.wall_s:.1f} / {b.settled_wall_s:.1f} | {per_listing:.2f} | {lst.percentile(50):.2f} | "
                   f"{lst.percentile(99):.2f} | {lst.listings} | {lst.errors} |")
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstreams", type=int, default=20, help="HTTP upstreams of the gateway (default: 20)")
    parser.add_argument("--tools", type=int, default=100, help="tools each upstream lists (default: 100)")
    parser.add_argument("--page-size", type=int, default=500, help="the gateway's catalogue.page_size (default: 500)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: none, half (default: both)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds of listing (default: 10)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds of listing (default: 1)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every case this many times, interleaved")
    parser.add_argument("--start-timeout", type=float, default=120.0, help="seconds to wait for the catalogue")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="write configs, gateway logs and audit files here and keep them (default: a temp dir)")
    parser.add_argument("--cpus", help="LOADGEN:SERVERS CPUs, e.g. 0:1 (the default on 2+ CPUs), or none")
    parser.add_argument("--raw", action="store_true",
                        help="measure listings replayed on a raw socket, answers read but not decoded (latency "
                             "without the load generator's JSON decoding)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="cProfile each gateway's measured listing phase into DIR/<case>-<round>.prof")
    args = parser.parse_args(argv)
    args.case_names = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not args.case_names or set(args.case_names) - set(CASES):
        parser.error(f"--cases: choose from {', '.join(CASES)}")
    if args.upstreams < 1 or args.tools < 2 or args.page_size < 1 or args.rounds < 1 or args.duration <= 0:
        parser.error("--upstreams, --page-size, --rounds >= 1, --tools >= 2, --duration > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[Row] = []
    try:
        cpus = Cpus.parse(args.cpus) if args.cpus else Cpus.default()
        key = ApiKey.new(KEY_ID)
        with ExitStack() as stack:
            work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bastion-catalogue-")))
            work.mkdir(parents=True, exist_ok=True)
            urls = {}
            for n in (args.tools, 1):
                port = free_port()
                stack.enter_context(started(
                    [sys.executable, str(BENCH / "upstream_fast.py"), "--port", str(port), "--tools", str(n)],
                    cpus=cpus, port=port, log=work / f"upstream-{n}.err"))
                urls[n] = f"http://127.0.0.1:{port}/mcp"
            cpus.pin_loadgen()
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
            for round_ in range(args.rounds):
                measured = []
                for case in args.case_names:
                    profile = None if args.profile is None else args.profile / f"{case}-{round_}.prof"
                    build, listing = run_gateway(work, cpus, name=case, upstream_url=urls[args.tools], args=args,
                                                 key=key, policy=case, tools_per_upstream=args.tools, listing=True,
                                                 profile=profile)
                    assert listing is not None
                    measured.append((case, build, listing))
                # After the cases, so that a first start's cold caches (page cache, bytecode) land on a case and
                # make its per-tool figure higher, not lower.
                baseline, _none = run_gateway(work, cpus, name="baseline", upstream_url=urls[1], args=args, key=key,
                                              policy="none", tools_per_upstream=1, listing=False)
                rows += [Row(case, build, baseline, args.upstreams * (args.tools - 1), listing)
                         for case, build, listing in measured]
    except BenchError as exc:
        print(f"catalogue_scale: {exc}", file=sys.stderr)
        return 1
    mean = rows[0].listing.mean_tool_bytes if rows else 0.0
    print(f"\nMachine: {machine_summary()}")
    print(f"Commit: {commit()}")
    print(f"Command: python bench/catalogue_scale.py {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print(f"Pinning: {cpus.describe()}")
    print(f"Catalogue: {args.upstreams} HTTP upstreams x {args.tools} tools = {args.upstreams * args.tools:,} tools, "
          f"{mean:,.0f} bytes per tool as listed, pages of {args.page_size}; listing at c=1"
          f"{' (raw: answers not decoded)' if args.raw else ''}, {args.warmup:g} s "
          f"warm-up + {args.duration:g} s measured, {args.rounds} round(s)\n")
    print(table(rows))
    with suppress(StopIteration):
        bad = next(r for r in rows if r.listing.errors)
        print(f"catalogue_scale: {bad.case}: {bad.listing.errors} listings failed or were incomplete", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
