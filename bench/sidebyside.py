"""bastion side by side with the floor and the peers, in one interleaved run: CPU per call and the ratios.

    python bench/sidebyside.py                       # everything, TypeScript SDK upstream, c=1 and c=32
    python bench/sidebyside.py --upstream fast --targets direct,bastion-off --duration 2 --rounds 1

Starts one upstream and, in front of it, every target at once on free loopback ports, then loads each target in
turn for ``--warmup`` + ``--duration`` seconds, at each ``--concurrency``, ``--rounds`` times over (interleaved:
a burst of load elsewhere on the machine spreads over all targets instead of landing on one). Targets:

    direct            the upstream alone
    nginx             nginx as a reverse proxy with keep-alive upstream connections: the floor of any HTTP proxy
    floor-lean        a bare asyncio protocol with httptools and bastion's upstream pool (``floor_lean.py``): the
                      least any Python proxy on this interpreter spends per call, without even a server framework
    floor             uvicorn and bastion's upstream pool forwarding bytes (``floor_asgi.py``): the floor of a
                      Python proxy on bastion's stack, before it checks, parses or records anything
    bastion-off       bastion with no auth, policy, limits, output validation, sanitizing, pinning or audit
    bastion-defaults  bastion as shipped: output validation, sanitizing, pinning, audit (to a file)
    bastion-full      API key, policy, rate limit and sessions in Redis, input+output validation, sanitizing,
                      pinning, file audit
    fastmcp           FastMCP's proxy sharing one upstream session: the cheapest Python peer, with no guards

The upstream (``--upstream``): ``ts``, the official TypeScript SDK server (``upstream_ts.mjs``: stateful, JSON
responses, one ``echo`` tool with input and output schemas), or ``fast``, the bespoke Python upstream
(``upstream_fast.py --structured``). nginx, the SDK and FastMCP are installed on first use (``peers.py``).

The load generator is ``loadgen.py``'s client, pinned to one CPU; the upstream, the proxies and Redis run on
another (``--cpus``). CPU per call is each process's own (``/proc/<pid>/stat``) over the measured window.

``--baseline REV`` adds every chosen bastion target again, run from ``src/`` of an earlier revision
(``baseline.py``), as ``bastion-off@<short>`` and so on, right after its counterpart in every round; the tables gain
the CPU ratio of each bastion target to its baseline. With ``bastion-full`` among the targets, the output ends with
a scale-out section (``scaleout.py``): Redis's CPU per call from its own ``INFO``, and how many single-core replicas
one Redis serves.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import peers
import redis
import scaleout
from baseline import Baseline, accepted_config, export
from harness import ApiKey, Cpus, bastion_command, commit, redis_command, started, write_config
from loadgen import (
    BENCH,
    REPO,
    BenchError,
    LoadSpec,
    Probe,
    Result,
    Target,
    describe,
    free_port,
    machine_summary,
    merge,
    run_load,
)

TARGETS = ("direct", "nginx", "floor-lean", "floor", "bastion-off", "bastion-defaults", "bastion-full", "fastmcp")
LABELS = {
    "direct": "direct (the upstream alone)",
    "nginx": "nginx reverse proxy, keep-alive upstream",
    "floor-lean": "floor without uvicorn: a bare protocol and bastion's upstream pool",
    "floor": "floor: uvicorn and bastion's upstream pool forwarding bytes",
    "bastion-off": "bastion, everything off",
    "bastion-defaults": "bastion defaults",
    "bastion-full": "bastion full",
    "fastmcp": f"FastMCP {peers.FASTMCP_VERSION} proxy, shared upstream session",
}
UPSTREAM_NAME = "up"  # bastion publishes the upstream's echo as up__echo
KEY_ID = "bench"
EN_DASH = "\u2013"  # ranges read "0.61\u20130.64", as in docs/performance.md
BASTION = ("bastion-off", "bastion-defaults", "bastion-full")


def kind(name: str) -> str:
    """``bastion-full@3e463c6`` is a ``bastion-full``, run from the baseline's source."""
    return name.partition("@")[0]


def label(name: str) -> str:
    base, _, rev = name.partition("@")
    return LABELS[base] + (f" @{rev}" if rev else "")


def with_baseline(names: Sequence[str], short: str | None) -> list[str]:
    """Each bastion target followed by its baseline twin: the two run back to back in every round, so that the
    ratio between them compares two windows as close in time as the interleaving allows."""
    out: list[str] = []
    for name in names:
        out.append(name)
        if short is not None and name in BASTION:
            out.append(f"{name}@{short}")
    return out


def baseline_of(name: str, names: Sequence[str]) -> str | None:
    """The baseline twin of a working-tree bastion target, when it runs."""
    twin = next((n for n in names if "@" in n and kind(n) == name), None)
    return twin if name in BASTION else None


@dataclass(frozen=True)
class Running:
    """One target, up and reachable: where to send calls and whose CPU time to read."""

    name: str
    url: str
    tool: str
    pids: Mapping[str, int]
    headers: Mapping[str, str] = field(default_factory=dict)
    probes: Mapping[str, Probe] = field(default_factory=dict)

    def target(self) -> Target:
        return Target(url=self.url, tool=self.tool, label=label(self.name), pids=self.pids, headers=self.headers,
                      probes=self.probes)


# -- bastion's three configurations -------------------------------------------------------------------------------


def bastion_config(name: str, *, port: int, upstream_url: str, work: Path, redis_url: str | None,
                   key: ApiKey) -> dict[str, Any]:
    """The gateway config of one bastion target. Pure: paths and addresses come in, a mapping goes out."""
    configuration = kind(name)
    doc: dict[str, Any] = {"listen": {"host": "127.0.0.1", "port": port},
                           "upstreams": {UPSTREAM_NAME: {"url": upstream_url}},
                           "logging": {"level": "warning"}}
    if configuration == "bastion-off":
        # Input validation cannot be switched off (docs/validation.md); everything else that can, is.
        return {**doc, "auth": "none", "validation": {"output": "off"}, "sanitize": {"enabled": False},
                "pinning": {"enabled": False}, "audit": {"sinks": []}}
    audit = {"sinks": [{"file": str(work / f"{name}.audit.jsonl")}]}
    if configuration == "bastion-defaults":
        return {**doc, "auth": "none", "pinning": {"file": str(work / f"{name}.pins.json")}, "audit": audit}
    if configuration == "bastion-full":
        if redis_url is None:
            raise BenchError("bastion-full needs Redis")
        policies = work / "policies"
        policies.mkdir(exist_ok=True)
        write_config(policies / "bench.yaml", {"version": 1, "rules": [
            {"id": "bench-caller-all", "effect": "allow", "description": "The load generator may call every tool.",
             "principals": {"ids": [KEY_ID]}}]})
        return {**doc, "auth": {"api_keys": [dict(key.entry)]}, "redis": {"url": redis_url},
                "policies": str(policies),
                "rate_limits": {"defaults": [{"name": "bench-per-principal", "rate": "1000000/second",
                                              "burst": 1000000, "per": "principal"}]},
                "validation": {"output": "strict"}, "sanitize": {"enabled": True}, "pinning": {"enabled": True},
                "audit": audit}
    raise BenchError(f"not a bastion target: {name}")


# -- starting everything ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """Every target up, the versions of what runs (for the header), and the keys each baseline config left out."""

    running: Sequence[Running]
    versions: Mapping[str, str]
    omitted: Mapping[str, Sequence[str]]


def start_all(stack: ExitStack, names: Sequence[str], *, upstream: str, cpus: Cpus, work: Path,
              baseline: Baseline | None = None) -> Started:
    """Start the upstream and every chosen target (``names`` with their baseline twins, if any)."""
    versions: dict[str, str] = {}
    omitted: dict[str, list[str]] = {}
    up_port = free_port()
    if upstream == "ts":
        up_cmd = peers.ts_upstream_command(up_port)
        versions["upstream"] = f"TypeScript SDK server (@modelcontextprotocol/sdk {peers.MCP_SDK_VERSION}, " \
                               f"Node {_version([up_cmd[0], '--version'])}), stateful, JSON responses"
    else:
        up_cmd = [sys.executable, str(BENCH / "upstream_fast.py"), "--port", str(up_port), "--structured"]
        versions["upstream"] = "bench/upstream_fast.py --structured (bespoke asyncio server)"
    up = stack.enter_context(started(up_cmd, cpus=cpus, port=up_port, log=work / "upstream.err"))
    upstream_url = f"http://127.0.0.1:{up_port}/mcp"
    base = {"upstream": up.pid}
    out: list[Running] = []
    key = ApiKey.new(KEY_ID)
    for name in names:
        print(f"starting {name} ...", file=sys.stderr, flush=True)
        if name == "direct":
            out.append(Running(name, upstream_url, "echo", base))
            continue
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        if name == "nginx":
            command = peers.nginx_command(peers.nginx_config(work, port=port, upstream_port=up_port))
            versions["nginx"] = _version([command[0], "-v"]).removeprefix("nginx version: ")
            proc = stack.enter_context(started(command, cpus=cpus, port=port, log=work / "nginx.err"))
            out.append(Running(name, url, "echo", {"proxy": proc.pid, **base}))
            continue
        if name in ("floor", "floor-lean"):
            script = "floor_asgi.py" if name == "floor" else "floor_lean.py"
            command = [sys.executable, str(BENCH / script), "--port", str(port), "--upstream", upstream_url]
            proc = stack.enter_context(started(command, cpus=cpus, port=port, log=work / f"{name}.err"))
            out.append(Running(name, url, "echo", {"proxy": proc.pid, **base}))
            continue
        if name == "fastmcp":
            command = peers.fastmcp_proxy_command(port, upstream_url)
            versions["fastmcp"] = peers.FASTMCP_VERSION
            proc = stack.enter_context(started(command, cpus=cpus, port=port, log=work / "fastmcp.err"))
            out.append(Running(name, url, "echo", {"proxy": proc.pid, **base}))
            continue
        pids = dict(base)
        headers: Mapping[str, str] = {}
        probes: dict[str, Probe] = {}
        redis_url = None
        if kind(name) == "bastion-full":
            # A Redis of its own per full target: its CPU and command counts over a window are then the loaded
            # gateway's alone, not mixed with what an idle gateway (the other revision's) sends meanwhile.
            redis_port = free_port()
            server = stack.enter_context(started(redis_command(redis_port, work), cpus=cpus, port=redis_port,
                                                 log=work / f"{name}.redis.err"))
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            versions["redis"] = _version([redis_command(0, work)[0], "--version"]).split(" sha=")[0]
            client = redis.Redis.from_url(redis_url, socket_timeout=10)
            stack.callback(client.close)
            pids["redis"] = server.pid
            probes[scaleout.PROBE] = scaleout.redis_probe(client)
            headers = key.headers
        doc = bastion_config(name, port=port, upstream_url=upstream_url, work=work, redis_url=redis_url, key=key)
        config = work / f"{name}.yaml"
        env, cwd = None, None
        if "@" in name:
            if baseline is None:
                raise BenchError(f"{name}: a baseline target, but no --baseline")
            doc, omitted[name] = accepted_config(baseline, doc, config)
            env, cwd = baseline.env(), baseline.root
        write_config(config, doc)
        proc = stack.enter_context(started(bastion_command(config), cpus=cpus, log=work / f"{name}.err", env=env,
                                           ready_url=f"http://127.0.0.1:{port}/readyz", cwd=cwd or REPO))
        pids["proxy"] = proc.pid
        out.append(Running(name, url, f"{UPSTREAM_NAME}__echo", pids, headers, probes))
    return Started(running=out, versions=versions, omitted=omitted)


def _version(args: list[str]) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "unknown"
    return (done.stdout + done.stderr).strip().splitlines()[0] if (done.stdout + done.stderr).strip() else "unknown"


# -- running and pooling ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """Per concurrency: each target's pooled result, and its rounds one by one (for the ranges)."""

    pooled: Mapping[int, Sequence[Result]]
    rounds: Mapping[int, Mapping[str, Sequence[Result]]]


def measure(running: Sequence[Running], concurrencies: Sequence[int], spec: LoadSpec, rounds: int) -> Measured:
    # One unmeasured pass over every target first: V8's JIT, CPython's caches and every connection pool are warm
    # before the first measured window, which would otherwise pay for them alone.
    for target in running:
        print(f"priming {target.name} ...", file=sys.stderr, flush=True)
        asyncio.run(run_load(target.target(), LoadSpec(concurrency=max(concurrencies), duration=spec.warmup or 0.1,
                                                       warmup=0, arguments=spec.arguments)))
    raw: dict[int, list[Result]] = {c: [] for c in concurrencies}
    for r in range(rounds):
        for c in concurrencies:
            for target in running:
                print(f"round {r + 1}/{rounds}, c={c}: {target.name} ...", file=sys.stderr, flush=True)
                result = asyncio.run(run_load(target.target(), LoadSpec(
                    concurrency=c, duration=spec.duration, warmup=spec.warmup, arguments=spec.arguments)))
                print(describe(result), file=sys.stderr, flush=True)
                raw[c].append(result)
    by_round: dict[int, dict[str, list[Result]]] = {}
    for c, results in raw.items():
        for result in results:
            by_round.setdefault(c, {}).setdefault(result.label, []).append(result)
    return Measured(pooled={c: merge(results) for c, results in raw.items()}, rounds=by_round)


# -- tables -------------------------------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ratio(value: float | None, base: float | None, digits: int = 2) -> str:
    if value is None or base is None or base == 0:
        return "—"
    return f"{value / base:.{digits}f}"


def _find(results: Sequence[Result], name: str) -> Result | None:
    return next((r for r in results if r.label == label(name)), None)


def detail_table(results: Sequence[Result], names: Sequence[str]) -> str:
    """One row per target at one concurrency; ratios against direct (throughput, latency), nginx and FastMCP, and,
    with a baseline, each bastion target's CPU against its baseline twin's."""
    direct, nginx, fastmcp = (_find(results, n) for n in ("direct", "nginx", "fastmcp"))
    nginx_cpu = nginx.cpu_ms_per_call("proxy") if nginx else None
    fastmcp_cpu = fastmcp.cpu_ms_per_call("proxy") if fastmcp else None
    with_baseline = any("@" in n for n in names)
    rows = ["| target | calls/s | p50 ms | p99 ms | proxy CPU ms/call | upstream CPU ms/call | Redis CPU ms/call | "
            "added p50 ms | calls/s vs direct | CPU vs nginx | CPU vs FastMCP | "
            + ("CPU vs baseline | " if with_baseline else "") + "errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if with_baseline else "") + "---:|"]
    for name in names:
        r = _find(results, name)
        if r is None:
            continue
        cpu = r.cpu_ms_per_call("proxy")
        added = None if direct is None or r is direct else r.percentile(50) - direct.percentile(50)
        rate = None if direct is None or r is direct or direct.rate == 0 else r.rate / direct.rate
        twin_name = baseline_of(name, names)
        twin = _find(results, twin_name) if twin_name else None
        vs_baseline = f"{_ratio(cpu, twin.cpu_ms_per_call('proxy') if twin else None)} | " if with_baseline else ""
        rows.append(
            f"| {r.label} | {r.rate:,.0f} | {_f(r.percentile(50))} | {_f(r.percentile(99))} | {_f(cpu, 3)} | "
            f"{_f(r.cpu_ms_per_call('upstream'), 3)} | {_f(r.cpu_ms_per_call('redis'), 3)} | "
            f"{'—' if added is None else f'{added:+.2f}'} | {_f(rate)} | {_ratio(cpu, nginx_cpu)} | "
            f"{_ratio(cpu, fastmcp_cpu)} | {vs_baseline}{r.errors} |")
    return "\n".join(rows)


def _span(values: Sequence[float | None], digits: int) -> str:
    """``a`` or ``a-b`` (an en dash, as in docs/performance.md) over the rounds."""
    present = [v for v in values if v is not None]
    if not present:
        return "—"
    low, high = min(present), max(present)
    return f"{low:.{digits}f}" if f"{low:.{digits}f}" == f"{high:.{digits}f}" else \
        f"{low:.{digits}f}{EN_DASH}{high:.{digits}f}"


def summary_table(measured: Measured, names: Sequence[str], low: int, high: int) -> str:
    """The figures the issue tracks, per target: CPU per call at both concurrencies (range over the rounds),
    added p50 at ``low``, p99/p50 and calls/s vs direct at ``high``, the CPU ratios at ``high``, and with a
    baseline the CPU ratio to it at both concurrencies."""
    def per_round(c: int, name: str, value: Callable[[Result, Mapping[str, Result]], float | None]) -> str:
        runs = measured.rounds[c].get(label(name), [])
        # Round i of every target ran in the same stretch of time, so ratios pair results round by round.
        partners = [{n: rs[i] for n in names if i < len(rs := measured.rounds[c].get(label(n), []))}
                    for i in range(len(runs))]
        return _span([value(run, partners[i]) for i, run in enumerate(runs)], 2)

    def cpu(r: Result, _: Mapping[str, Result]) -> float | None:
        return r.cpu_ms_per_call("proxy")

    def added(r: Result, others: Mapping[str, Result]) -> float | None:
        return None if "direct" not in others else r.percentile(50) - others["direct"].percentile(50)

    def vs(other: str | None) -> Callable[[Result, Mapping[str, Result]], float | None]:
        def ratio(r: Result, others: Mapping[str, Result]) -> float | None:
            mine = r.cpu_ms_per_call("proxy")
            theirs = others[other].cpu_ms_per_call("proxy") if other is not None and other in others else None
            return None if mine is None or not theirs else mine / theirs
        return ratio

    def rate(r: Result, others: Mapping[str, Result]) -> float | None:
        return None if "direct" not in others or not others["direct"].rate else r.rate / others["direct"].rate

    def tail(r: Result, _: Mapping[str, Result]) -> float | None:
        return r.percentile(99) / r.percentile(50) if r.percentile(50) > 0 else None

    with_baseline = any("@" in n for n in names)
    rows = [f"| target | CPU ms/call c={low} | CPU ms/call c={high} | added p50 c={low} ms | p99/p50 c={high} | "
            f"calls/s c={high} vs direct | CPU vs nginx c={high} | CPU vs FastMCP c={high} |"
            + (f" CPU vs baseline c={low} | CPU vs baseline c={high} |" if with_baseline else ""),
            "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if with_baseline else "")]
    for name in names:
        if name == "direct":
            continue
        twin = baseline_of(name, names)
        rows.append(f"| {label(name)} | {per_round(low, name, cpu)} | {per_round(high, name, cpu)} | "
                    f"{per_round(low, name, added)} | {per_round(high, name, tail)} | "
                    f"{per_round(high, name, rate)} | {per_round(high, name, vs('nginx'))} | "
                    f"{per_round(high, name, vs('fastmcp'))} |"
                    + (f" {per_round(low, name, vs(twin))} | {per_round(high, name, vs(twin))} |"
                       if with_baseline else ""))
    return "\n".join(rows)


def scale_out(measured: Measured, names: Sequence[str], concurrencies: Sequence[int],
              headroom: float) -> list[scaleout.ScaleOut]:
    """The full pipeline's figures per concurrency, highest first (its derivation leads), the working tree's
    before the baseline's."""
    rows = []
    for name in (n for n in names if kind(n) == "bastion-full"):
        for c in sorted(concurrencies, reverse=True):
            result = _find(measured.pooled[c], name)
            row = scaleout.ScaleOut.of(result, c, headroom) if result is not None else None
            if row is not None:
                rows.append(row)
    return rows


def report(measured: Measured, names: Sequence[str], concurrencies: Sequence[int], header: Sequence[str],
           scale_header: Sequence[str] = (), headroom: float = scaleout.DEFAULT_HEADROOM) -> str:
    parts = list(header)
    for c in concurrencies:
        parts += ["", f"**c={c}** (rounds pooled):", "", detail_table(measured.pooled[c], names)]
    if len(concurrencies) >= 2:
        low, high = min(concurrencies), max(concurrencies)
        parts += ["", "**Summary** (ranges are over the rounds; CPU is the proxy process's own):", "",
                  summary_table(measured, names, low, high)]
    section = scaleout.section(scale_out(measured, names, concurrencies, headroom), scale_header)
    if section:
        parts += ["", section]
    return "\n".join(parts)


# -- command line -------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", choices=["ts", "fast"], default="ts",
                        help="ts: the official TypeScript SDK server (default); fast: bench/upstream_fast.py")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, in this order (default: all): {','.join(TARGETS)}")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated session counts (default: 1,32)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default: 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run (default: 2)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds, pooled (default: 2)")
    parser.add_argument("--cpus", help="LOADGEN:SERVERS CPUs, e.g. 0:1 (the default on 2+ CPUs), or none")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="write configs, server logs and audit files here and keep them (default: a temp dir)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run every chosen bastion target from src/ of this git revision (e.g. 3e463c6), "
                             "interleaved, and show each one's CPU ratio to it (default: none)")
    parser.add_argument("--headroom", type=float, default=scaleout.DEFAULT_HEADROOM,
                        help="scale-out: the share of its core Redis may use (default: 0.7)")
    args = parser.parse_args(argv)
    args.target_names = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(args.target_names) - set(TARGETS))
    if unknown or not args.target_names:
        parser.error(f"--targets: unknown {unknown}; known: {', '.join(TARGETS)}")
    try:
        args.levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error("--concurrency: comma-separated integers")
    if min(args.levels) < 1 or args.duration <= 0 or args.warmup < 0 or args.rounds < 1:
        parser.error("--concurrency and --rounds must be >= 1, --duration > 0, --warmup >= 0")
    if not 0 < args.headroom <= 1:
        parser.error("--headroom: a share of one core, in (0, 1]")
    if args.baseline is not None and not set(args.target_names) & set(BASTION):
        parser.error("--baseline: no bastion target to compare (--targets has none of "
                     f"{', '.join(BASTION)})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cpus = Cpus.parse(args.cpus) if args.cpus else Cpus.default()
        # The baseline's export and installs come first, so that a missing peer fails before anything runs.
        baseline = export(args.baseline) if args.baseline is not None else None
        names = with_baseline(args.target_names, baseline.short if baseline else None)
        with ExitStack() as stack:
            work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bastion-sidebyside-")))
            work.mkdir(parents=True, exist_ok=True)
            up = start_all(stack, names, upstream=args.upstream, cpus=cpus, work=work, baseline=baseline)
            cpus.pin_loadgen()
            spec = LoadSpec(duration=args.duration, warmup=args.warmup)
            measured = measure(up.running, args.levels, spec, args.rounds)
    except BenchError as exc:
        print(f"sidebyside: {exc}", file=sys.stderr)
        return 1
    machine, tree = machine_summary(), commit()
    command = f"python bench/sidebyside.py {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip()
    header = [
        "",
        f"Machine: {machine}",
        f"Commit: {tree}" + (" (the bastion targets without @)" if baseline else ""),
        *baseline_lines(baseline, up.omitted),
        f"Command: {command}",
        f"Pinning: {cpus.describe()}",
        "Versions: " + "; ".join(f"{k} {v}" for k, v in up.versions.items()),
        f"Load: {args.warmup:g} s warm-up + {args.duration:g} s measured per run, {args.rounds} interleaved "
        f"round(s), concurrency {', '.join(map(str, args.levels))}, arguments {{\"text\": \"hello\"}}",
    ]
    scale_header = [f"Measured with `{command}`: commit {tree}"
                    + (f", baseline {baseline.short}" if baseline else "") + f"; {machine}; {cpus.describe()}; "
                    f"{args.rounds} round(s) of {args.duration:g} s pooled per concurrency. Redis: "
                    f"{up.versions.get('redis', 'unknown')}, a server of its own per full target."]
    print(report(measured, names, args.levels, header, scale_header, args.headroom))
    failed = [r for rs in measured.pooled.values() for r in rs if r.errors]
    for r in failed:
        print(f"sidebyside: {r.label}: {r.errors} failed calls (first: {r.first_error})", file=sys.stderr)
    return 1 if failed else 0


def baseline_lines(baseline: Baseline | None, omitted: Mapping[str, Sequence[str]]) -> list[str]:
    if baseline is None:
        return []
    lines = [f"Baseline: {baseline.describe()} (the @{baseline.short} targets; same interpreter and virtualenv)"]
    left_out = {name: keys for name, keys in omitted.items() if keys}
    if left_out:
        lines.append("Baseline config: the old revision does not know, so its config leaves out: "
                     + "; ".join(f"{name}: {', '.join(keys)}" for name, keys in left_out.items()))
    else:
        lines.append(f"Baseline config: the same as the working tree's ({baseline.short}'s `bastion check` accepts "
                     "every key)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
