"""The catalogue at scale, in process: CPU to build a catalogue view, and CPU and latency of a full tools/list.

    python bench/bench_catalogue_build.py                         # 20 upstreams x 100 tools of ~1.3 KB
    python bench/bench_catalogue_build.py --upstreams 50 --tools 200 --listings 100
    PYTHONPATH=/tmp/main/src python bench/bench_catalogue_build.py   # another bastion tree, for before/after

**Build**: ``ViewPublisher.rebuild`` as the gateway runs it, with the defaults' configs and steps:
``catalogue.build`` (in a worker thread), then the view steps ``CompileSchemas``, ``SanitizeDefinitions`` (both
``Reusable``), ``PinTools`` (file store in a temporary directory) and ``AuditCatalogueDrops``, logging JSON to
/dev/null at ``info`` as a deployment would. ``first`` is a fresh gateway (nothing pinned, nothing cached);
``again`` rebuilds from the same lists, as every periodic refresh that found nothing new does (the pool hands on
the very lists it had); ``changed`` after one tool of every upstream changed its description. CPU is the
process's (every thread), per tool, including the garbage collection the build causes up to the next build.
``max stall`` is the longest the event loop went without running a 1 ms ticker while the build ran and for 0.3 s
after it (the collection of what the build allocated may come after): how long other clients' calls could wait.

**Listing**: one full ``tools/list`` (every page, ``--page-size`` tools each) as the dispatcher answers it and
the HTTP layer encodes it (orjson), from the gateway's listing cache, for a caller without a policy and for one
whose policy shows half of the upstreams; ``uncached`` is the same work done per request, as before the cache
(filter, copy, encode), measured in the same run. CPU per listing, and the wall-clock p50/p99 of a listing at
concurrency 1 (``--listings`` listings, after one warm-up listing).

The corpus is ``tests/support/catalogue_corpus.py``: deterministic, every definition and schema different.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.catalogue_corpus import upstream_lists  # noqa: E402

from bastion import catalogue as cat  # noqa: E402
from bastion.access import AllowAll  # noqa: E402
from bastion.audit import AuditCatalogueDrops, AuditEvents  # noqa: E402
from bastion.changes import ChangeFeed  # noqa: E402
from bastion.logs import configure_logging  # noqa: E402
from bastion.metrics import Metrics  # noqa: E402
from bastion.pinning import (  # noqa: E402
    FilePinStore,
    Pinning,
    PinningConfig,
    PinTools,
)
from bastion.policy.guard import PolicyAccess, PolicyHolder  # noqa: E402
from bastion.policy.load import PolicyText, compile_policies  # noqa: E402
from bastion.principal import Principal  # noqa: E402
from bastion.sanitize import SanitizeDefinitions  # noqa: E402
from bastion.sanitize.config import SanitizeConfig  # noqa: E402
from bastion.validation import CompileSchemas, ValidationConfig  # noqa: E402
from bastion.view import Reusable, View, ViewPublisher  # noqa: E402
from bastion.visibility import ToolListings  # noqa: E402

# Logs as a deployment writes them (JSON at info), to nowhere: their CPU counts, their I/O does not.
DEVNULL = open(os.devnull, "w")  # noqa: SIM115 (for the whole run)


class _Audit:
    """The audit log's ``emit``: records are built by the steps, then dropped (the sink is not measured here)."""

    async def emit(self, record: dict[str, Any]) -> None:
        return None


def steps(work: Path) -> list[Callable[[View, Any], Awaitable[View]]]:
    events = AuditEvents(_Audit().emit)
    pinning = Pinning(FilePinStore(work / "pins.json"), PinningConfig())
    return [CompileSchemas(ValidationConfig(), Metrics()), SanitizeDefinitions(SanitizeConfig.from_mapping(None),
                                                                               events),
            PinTools(pinning, events), AuditCatalogueDrops(events)]


class Timed:
    """A view step that adds its CPU time to ``cpu`` under its step's name."""

    def __init__(self, step: Any, cpu: dict[str, float]) -> None:
        self.step, self.cpu, self.name = step, cpu, type(step).__name__

    async def __call__(self, view: View, lists: Any) -> View:
        start = time.process_time()
        try:
            return cast(View, await self.step(view, lists))
        finally:
            self.cpu[self.name] = self.cpu.get(self.name, 0.0) + time.process_time() - start


def publisher(work: Path, cpu: dict[str, float]) -> ViewPublisher:
    compile_, sanitize, pin, drops = steps(work)
    return ViewPublisher((), [Reusable(Timed(compile_, cpu)), Reusable(Timed(sanitize, cpu)), Timed(pin, cpu),
                              Timed(drops, cpu)], ChangeFeed())


async def measured_rebuild(lists: dict[str, cat.UpstreamLists], views: ViewPublisher, cpu: dict[str, float]
                           ) -> tuple[View, float, float]:
    """Rebuild through ``views``; (the view, CPU seconds, max stall seconds). ``cpu`` gets each step's CPU."""
    stall = 0.0
    done = False

    async def ticker() -> None:
        nonlocal stall
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            stall = max(stall, now - last)
            last = now

    cpu.clear()
    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start = time.process_time()
    try:
        await views.rebuild(lists)
        # The young collection of what the build allocated, if it comes after the build, belongs to it.
        await asyncio.sleep(0.3)
    finally:
        done = True
        await tick
    return views.view, time.process_time() - start, stall


def changed(lists: dict[str, cat.UpstreamLists]) -> dict[str, cat.UpstreamLists]:
    out = {}
    for name, up in lists.items():
        tools = [dict(t) for t in up.tools]
        tools[0] = {**tools[0], "description": tools[0]["description"] + " Now also archives."}
        out[name] = dataclasses.replace(up, tools=tools)
    return out


def half_policy(upstreams: int) -> PolicyAccess:
    prefixes = ", ".join(f'"u{u:02d}__*"' for u in range(0, upstreams, 2))
    text = f"""
version: 1
rules:
  - id: half
    effect: allow
    principals: {{groups: [half]}}
    tools: [{prefixes}]
"""
    return PolicyAccess(PolicyHolder(compile_policies([PolicyText("bench.yaml", text)])))


def full_listing_cached(listings: Any, view: View, access: Any, principal: Principal, size: int) -> int:
    """Every page, as ``Dispatcher._tools_list`` answers it and ``jsonrpc.dumps`` encodes it; bytes sent."""
    sent, cursor, rid = 0, None, 0
    while True:
        listing = listings.listing(view, access, principal)
        tools, cursor = listing.page(cursor, size)
        result: dict[str, Any] = {"tools": tools}
        if cursor is not None:
            result["nextCursor"] = cursor
        rid += 1
        sent += len(orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result}))
        if cursor is None:
            return sent


def full_listing_uncached(view: View, access: Any, principal: Principal, size: int) -> int:
    """The same answers computed per request, as before the cache."""
    sent, cursor, rid = 0, None, 0
    while True:
        visible = [t for t in view.catalogue.tools if t.public_name not in view.quarantined
                   and t.upstream not in view.unavailable and access.tool_visible(principal, t)]
        names = [t.public_name for t in visible]
        start, end, cursor = cat.page(names, cursor, size)
        result: dict[str, Any] = {"tools": [dict(t.definition) for t in visible[start:end]]}
        if cursor is not None:
            result["nextCursor"] = cursor
        rid += 1
        sent += len(orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result}))
        if cursor is None:
            return sent


def measure_listing(run: Callable[[], int], count: int) -> tuple[float, float, float, int]:
    """(CPU ms per listing, p50 ms, p99 ms, bytes per listing), after one warm-up listing."""
    sent = run()
    walls = []
    cpu_start = time.process_time()
    for _ in range(count):
        start = time.perf_counter()
        run()
        walls.append(time.perf_counter() - start)
    cpu = (time.process_time() - cpu_start) / count
    walls.sort()
    return cpu * 1e3, statistics.median(walls) * 1e3, walls[min(len(walls) - 1, int(0.99 * len(walls)))] * 1e3, sent


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstreams", type=int, default=20)
    parser.add_argument("--tools", type=int, default=100, help="tools per upstream")
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--listings", type=int, default=200)
    args = parser.parse_args()
    configure_logging("json", "info", stream=DEVNULL)
    lists = upstream_lists(args.upstreams, args.tools)
    n = args.upstreams * args.tools
    size = sum(len(orjson.dumps(t)) for up in lists.values() for t in up.tools) / n
    print(f"# {n} tools ({args.upstreams} upstreams x {args.tools}), {size:.0f} bytes per definition on average; "
          f"python {sys.version.split()[0]}, pid {os.getpid()}, load average {os.getloadavg()[0]:.2f}")
    print()
    print("| build | CPU ms | CPU ms/tool | merge and the rest | compile | sanitize | pin | audit drops | "
          "max stall ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        cpu: dict[str, float] = {}
        views = publisher(Path(tmp), cpu)
        view = View()
        for label, source in (("first", lists), ("again", lists), ("changed", changed(lists))):
            view, total, stall = await measured_rebuild(source, views, cpu)
            # The 0.3 s of idling after the build costs the ticker's wake-ups only: not subtracted.
            merge = total - sum(cpu.values())
            parts = " | ".join(f"{cpu.get(k, 0.0) * 1e3:.0f}" for k in ("CompileSchemas", "SanitizeDefinitions",
                                                                        "PinTools", "AuditCatalogueDrops"))
            print(f"| {label} | {total * 1e3:.0f} | {total / n * 1e3:.3f} | {merge * 1e3:.0f} | {parts} | "
                  f"{stall * 1e3:.1f} |")
    print()
    print(f"| full tools/list ({args.page_size} per page) | CPU ms/listing | p50 ms | p99 ms | tools shown | "
          "bytes |")
    print("|---|---|---|---|---|---|")
    everyone = Principal(id="alice")
    half = Principal(id="bob", groups=frozenset({"half"}))
    for label, access, principal in (("no policy", AllowAll(), everyone),
                                      ("policy shows half", half_policy(args.upstreams), half)):
        shown = len([t for t in view.catalogue.tools if access.tool_visible(principal, t)])
        listings = ToolListings()
        rows: list[tuple[str, Callable[[], int]]] = [
            ("cached", lambda a=access, p=principal, c=listings: full_listing_cached(c, view, a, p, args.page_size)),
            ("uncached", lambda a=access, p=principal: full_listing_uncached(view, a, p, args.page_size))]
        for kind, run in rows:
            count = args.listings if kind == "cached" else max(10, args.listings // 10)
            cpu_ms, p50, p99, sent = measure_listing(run, count)
            print(f"| {label}, {kind} | {cpu_ms:.2f} | {p50:.2f} | {p99:.2f} | {shown} | {sent} |")


if __name__ == "__main__":
    asyncio.run(main())
