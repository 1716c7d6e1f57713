"""Instructions per forwarded call, counted by valgrind: an A/B that a busy machine cannot blur.

    python bench/instructions.py --scenario off --scenario full --baseline 057fd84
    python bench/instructions.py --scenario defaults --calls 300 --concurrency 32
    python bench/instructions.py --scenario floor --scenario off     # the stack's floor beside bastion
    python bench/instructions.py --scenario nginx --scenario floor   # nginx (one process) beside that floor
    python bench/instructions.py --scenario floor-lean --scenario floor --calls 1000   # what uvicorn costs

CPU seconds per call (``loadgen.py``, ``sidebyside.py``) are the figure to compare with other proxies, but on a
shared 2-core machine they move by ±15% between two runs of the same code, which hides a change worth 5%. This
counts instead what the gateway's CPU executes: the gateway runs under ``valgrind --tool=callgrind`` (about 50
times slower, so the limits that guard against a slow Redis or upstream are raised for the run), one fast upstream
(``upstream_fast.py --structured``) and, for scenarios that need one, a ``redis-server`` of its own run beside
it; the load opens ``--concurrency`` sessions, makes ``--warmup`` calls, zeroes the counters
(``callgrind_control -z``), makes exactly ``--calls`` calls, and dumps them (``callgrind_control -d``). The figure
is the dump's instruction count divided by the calls: the gateway's own work, all threads, user space only (the
kernel's share of a send or a receive is not in it, and neither is the time a call waits).

The same count for the same code and load repeats within about 1% (garbage collections and dict resizes fall a
little differently each run). A counted window also carries work that does not grow with the number of calls
(with ``--calls 1``: 31.5 M instructions for everything-off, 5.3 M for the floor), 0.16 M of a 200-call count's
0.82 M per call for everything-off and a fifth of that at 1,000 calls: ratios between equal windows stand,
per-call figures want ``--calls 1000``. ``--baseline REV`` runs each scenario again from ``src/`` of an earlier revision
(``baseline.py``), right after the working tree's, and prints the ratio.

Work on a clock (the collector every second, health probes, the session cache's write-behind every 100 ms) runs as
often per wall second under callgrind as without it, so per call it weighs about 50 times more than in real
use. After the counted calls, the gateway is counted again for as long as they took, with no calls: the "of which
timers" column, per call. It is an estimate of that share (a write-behind that has nothing to write does less).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml
from baseline import Baseline, accepted_config, export
from loadgen import (
    BENCH,
    REPO,
    BenchError,
    McpSession,
    Scenario,
    free_port,
    gateway_config,
    load_scenarios,
    machine_summary,
    place_audit_files,
    running,
    stop,
    wait_port,
    wait_ready,
)
from peers import nginx_command, nginx_config

ARGUMENTS = {"text": "hello"}
# The sum of the part's cost lines; its "summary:" line can be lower after a zeroing (the frames on the stack).
TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)
DUMPED = b"desc: Trigger: dump"
PART = re.compile(rb"^part:\s+(\d+)", re.MULTILINE)
# Under valgrind a call takes tens of milliseconds: the deadlines that would turn that into refusals are raised.
SLOW_LIMITS: dict[str, Any] = {"rate_limits": {"timeout": "30s"}}
# Not a bastion configuration: uvicorn and bastion's upstream pool forwarding bytes (floor_asgi.py), the stack's floor.
FLOOR = "floor"
# Not a bastion configuration: the same forwarding on a bare asyncio protocol (floor_lean.py), what uvicorn costs.
FLOOR_LEAN = "floor-lean"
# Not Python at all: nginx proxying to the same upstream (peers.nginx_config, one process), the floor of any proxy.
NGINX = "nginx"
REFERENCES = {FLOOR: "floor: uvicorn and the upstream pool forwarding bytes",
              FLOOR_LEAN: "floor without uvicorn: an asyncio protocol, httptools and the upstream pool",
              NGINX: "nginx reverse proxy, keep-alive upstream (one process)"}


def slow(doc: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    if "rate_limits" in out:
        out["rate_limits"] = {**out["rate_limits"], **SLOW_LIMITS["rate_limits"]}
    return out


async def load(url: str, headers: dict[str, str], concurrency: int, calls: int, tool: str) -> int:
    sessions = [McpSession(url, headers) for _ in range(concurrency)]
    await asyncio.gather(*(s.open() for s in sessions))
    errors = 0
    left = calls

    async def worker(session: McpSession) -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            if await session.call(tool, ARGUMENTS) is not None:
                errors += 1

    try:
        await asyncio.gather(*(worker(s) for s in sessions))
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
    return errors


def count(name: str, doc: dict[str, Any], headers: dict[str, str], work: Path, args: argparse.Namespace,
          baseline: Baseline | None) -> tuple[float, float]:
    """Instructions per call of one gateway, started under callgrind, warmed up, counted over ``--calls``; and
    what the same gateway executed with no calls for as long as those calls took, per call (its timers)."""
    port = free_port()
    doc = slow({**doc, "listen": {**doc.get("listen", {}), "host": "127.0.0.1", "port": port}})
    config = work / f"{name}.yaml"
    env, cwd = None, REPO
    if baseline is not None:
        doc, omitted = accepted_config(baseline, doc, config)
        if omitted:
            print(f"{name}: left out of the baseline config (unknown to it): {', '.join(omitted)}", file=sys.stderr)
        env, cwd = baseline.env(), baseline.root
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = work / f"{name}.callgrind"
    served = [sys.executable, "-m", "bastion", "serve", "--config", str(config), "--grace", "5"]
    upstream_url = next(iter(doc["upstreams"].values()))["url"]
    if name in (FLOOR, FLOOR_LEAN):
        script = "floor_asgi.py" if name == FLOOR else "floor_lean.py"
        served = [sys.executable, str(BENCH / script), "--port", str(port), "--upstream", upstream_url]
    elif name == NGINX:
        upstream_port = int(upstream_url.rsplit(":", 1)[1].split("/", 1)[0])
        served = nginx_command(nginx_config(work, port=port, upstream_port=upstream_port))
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
               "--collect-jumps=no", *served]
    log = work / f"{name}.err"
    with (work / f"{name}.audit").open("wb") as audit, log.open("wb") as err:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=audit, stderr=err)
        try:
            if name in REFERENCES:
                wait_port(port, proc, timeout=600)
            else:
                wait_ready(f"http://127.0.0.1:{port}/readyz", proc, log, timeout=600)
            url = f"http://127.0.0.1:{port}/mcp"
            tool = "echo" if name in REFERENCES else "fast__echo"
            asyncio.run(load(url, headers, args.concurrency, args.warmup, tool))
            subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
            started = time.monotonic()
            errors = asyncio.run(load(url, headers, args.concurrency, args.calls, tool))
            took = time.monotonic() - started
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
            # The same wall time without calls: what timers (collector, health probes, write-behind) execute.
            subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
            time.sleep(took)
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
        finally:
            stop(proc, timeout=120)
    if errors:
        raise BenchError(f"{name}: {errors} of {args.calls} calls failed; see {log}")
    # The parts callgrind_control -d wrote, in order (the one the process wrote at exit holds what came after).
    parts: dict[int, int] = {}
    for path in work.glob(f"{name}.callgrind*"):
        data = path.read_bytes()
        part, total = PART.search(data), TOTALS.search(data)
        if DUMPED in data and part is not None and total is not None:
            parts[int(part.group(1))] = int(total.group(1))
    if len(parts) != 2:
        raise BenchError(f"{name}: expected two dumped parts with totals, found {len(parts)}")
    counted, idle = (parts[k] for k in sorted(parts))
    return counted / args.calls, idle / args.calls


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", action="append", required=True, help="bench/scenarios/<name>.yaml")
    parser.add_argument("--calls", type=int, default=400, help="calls counted per gateway (default: 400)")
    parser.add_argument("--warmup", type=int, default=100, help="calls before counting (default: 100)")
    parser.add_argument("--concurrency", type=int, default=1, help="concurrent sessions (default: 1)")
    parser.add_argument("--baseline", metavar="REV", help="also count each scenario from src/ of REV")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise BenchError("valgrind is not installed (Debian package valgrind)")
    scenarios = load_scenarios()
    baseline = export(args.baseline) if args.baseline else None
    rows: list[tuple[str, tuple[float, float], tuple[float, float] | None]] = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bastion-instr-")))
        up_port = free_port()
        stack.enter_context(running([sys.executable, str(BENCH / "upstream_fast.py"), "--port", str(up_port),
                                     "--structured"], port=up_port))
        redis_url = None
        if any(s not in REFERENCES and scenarios[s].needs_redis for s in args.scenario):
            redis_port = free_port()
            exe = shutil.which("redis-server") or "redis-server"
            stack.enter_context(running([exe, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no", "--dir", str(work)], port=redis_port))
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
        for name in args.scenario:
            scenario = scenarios[name] if name not in REFERENCES else Scenario(name, REFERENCES[name], None)
            upstream_url = f"http://127.0.0.1:{up_port}/mcp"
            if name in REFERENCES:
                doc: dict[str, Any] = {"upstreams": {"fast": {"url": upstream_url}}}
            else:
                doc = place_audit_files(gateway_config(scenario, port=0, upstream_url=upstream_url,
                                                       redis_url=redis_url), work)
            now = count(name, doc, dict(scenario.headers), work, args, None)
            print(f"{name}: {now[0] / 1e6:.3f} M instructions per call, idle {now[1] / 1e6:.3f}", file=sys.stderr,
                  flush=True)
            old = None
            if baseline is not None and name not in REFERENCES:
                old = count(f"{name}@{baseline.short}", doc, dict(scenario.headers), work, args, baseline)
                print(f"{name}@{baseline.short}: {old[0] / 1e6:.3f} M instructions per call, idle "
                      f"{old[1] / 1e6:.3f}", file=sys.stderr, flush=True)
            rows.append((scenario.label, now, old))
    print(machine_summary())
    print(f"Command: python bench/{Path(__file__).name} {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"Load: {args.concurrency} session(s), {args.warmup} calls of warm-up, {args.calls} counted")
    print()
    short = baseline.short if baseline is not None else None
    print("| scenario | M instructions/call | of which timers | " + (f"@{short} | of which timers | ratio |" if short
                                                                   else ""))
    print("|---|---:|---:|" + ("---:|---:|---:|" if short else ""))
    for label, now, old in rows:
        tail = f" {old[0] / 1e6:.3f} | {old[1] / 1e6:.3f} | {now[0] / old[0]:.2f} |" if old else ""
        print(f"| {label} | {now[0] / 1e6:.3f} | {now[1] / 1e6:.3f} |{tail}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BenchError as exc:
        print(f"instructions: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
