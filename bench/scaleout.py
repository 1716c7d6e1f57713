"""Scale-out on paper: how many single-core bastion replicas one Redis serves, derived from one run's measurements.

A 2-core machine cannot run ten replicas against one Redis, but it can measure the two costs the answer depends on:
the CPU one replica spends per call (its own ``/proc`` figure), and the CPU Redis spends per call, which Redis
counts itself (``INFO cpu``: ``used_cpu_sys`` + ``used_cpu_user``, microsecond resolution, where ``/proc`` counts
10 ms ticks), together with the commands each call costs it (``INFO commandstats``). Then:

    calls/s one bastion core serves = 1000 / bastion CPU ms per call
    calls/s one Redis core serves   = 1000 / Redis CPU ms per call
    replicas per Redis              = headroom x Redis calls/s / replica calls/s   (rounded down)

Assumptions, printed with the figures: Redis executes commands on one thread, so one Redis saturates at one core;
replicas scale linearly (each on a core of its own, nothing shared but Redis); every call is the measured one;
Redis is kept below ``headroom`` of its core, because latency grows fast as a single-threaded server's queue fills.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen import Probe, Result

PROBE = "redis"  # counters read as "redis:<name>"
CPU = f"{PROBE}:cpu_s"
CALLS = f"{PROBE}:calls."
USEC = f"{PROBE}:usec."
OWN_COMMANDS = frozenset({"info"})  # the probe's own, at the window's edges: not the gateway's
DEFAULT_HEADROOM = 0.7


def redis_counters(cpu: Mapping[str, Any], commandstats: Mapping[str, Any]) -> dict[str, float]:
    """Redis's cumulative CPU seconds (all threads) and, per command, its calls and microseconds, from parsed
    ``INFO cpu`` and ``INFO commandstats`` (``{"cmdstat_get": {"calls": 3, "usec": 12, ...}, ...}``)."""
    out = {"cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])}
    for name, stats in commandstats.items():
        command = name.removeprefix("cmdstat_")
        out[f"calls.{command}"] = float(stats["calls"])
        out[f"usec.{command}"] = float(stats["usec"])
    return out


def redis_probe(client: Any) -> Probe:
    """A probe over a synchronous ``redis.Redis`` client (two ``INFO`` round trips per reading)."""
    def read() -> Mapping[str, float]:
        return redis_counters(client.info("cpu"), client.info("commandstats"))
    return read


@dataclass(frozen=True)
class ScaleOut:
    """One full-pipeline measurement, and what follows from it."""

    label: str
    concurrency: int
    calls: int
    replica_cpu_ms: float  # the gateway process's CPU per call (/proc)
    redis_cpu_ms: float  # Redis's own count (INFO cpu) per call
    redis_proc_cpu_ms: float | None  # the same from /proc, as a cross-check
    commands: Mapping[str, float]  # Redis commands per call, by command
    redis_command_ms: float  # time Redis spent inside commands per call (commandstats usec)
    headroom: float

    @classmethod
    def of(cls, result: Result, concurrency: int, headroom: float) -> ScaleOut | None:
        """None when the run has no Redis counters or no calls (not a full-pipeline run)."""
        replica = result.cpu_ms_per_call("proxy")
        redis_s = result.per_call(CPU)
        if replica is None or redis_s is None or result.calls == 0:
            return None
        commands = {key.removeprefix(CALLS): value / result.calls for key, value in result.counters.items()
                    if key.startswith(CALLS) and key.removeprefix(CALLS) not in OWN_COMMANDS and value > 0}
        usec = sum(value for key, value in result.counters.items()
                   if key.startswith(USEC) and key.removeprefix(USEC) not in OWN_COMMANDS)
        return cls(label=result.label, concurrency=concurrency, calls=result.calls, replica_cpu_ms=replica,
                   redis_cpu_ms=redis_s * 1000, redis_proc_cpu_ms=result.cpu_ms_per_call("redis"),
                   commands=dict(sorted(commands.items(), key=lambda kv: (-kv[1], kv[0]))),
                   redis_command_ms=usec / 1000 / result.calls, headroom=headroom)

    @property
    def replica_rate(self) -> float:
        """Calls/s one core of bastion serves."""
        return 1000 / self.replica_cpu_ms if self.replica_cpu_ms > 0 else math.inf

    @property
    def redis_rate(self) -> float:
        """Calls/s one Redis core serves."""
        return 1000 / self.redis_cpu_ms if self.redis_cpu_ms > 0 else math.inf

    @property
    def replicas(self) -> float:
        """Single-core replicas one Redis serves at ``headroom`` of its core (not rounded)."""
        return self.headroom * self.redis_rate / self.replica_rate

    @property
    def commands_per_call(self) -> float:
        return sum(self.commands.values())


def _n(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:,.0f}"


def section(rows: Sequence[ScaleOut], header: Sequence[str]) -> str:
    """A Markdown section for docs/performance.md: the inputs per run, then the derivation for the first row
    (the working tree's full pipeline at the highest concurrency, where a replica's cost per call is lowest)."""
    if not rows:
        return ""
    pct = f"{rows[0].headroom:.0%}"
    lines = ["### Scale-out on paper", "", *header, "",
             f"| target | c | bastion CPU ms/call | Redis CPU ms/call (INFO) | Redis CPU ms/call (/proc) | "
             f"Redis commands/call | in Redis commands ms/call | calls/s per bastion core | calls/s per Redis core | "
             f"replicas per Redis at {pct} |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        proc = "—" if r.redis_proc_cpu_ms is None else f"{r.redis_proc_cpu_ms:.3f}"
        lines.append(f"| {r.label} | {r.concurrency} | {r.replica_cpu_ms:.3f} | {r.redis_cpu_ms:.4f} | {proc} | "
                     f"{r.commands_per_call:.2f} | {r.redis_command_ms:.4f} | {_n(r.replica_rate)} | "
                     f"{_n(r.redis_rate)} | {r.replicas:.1f} |")
    first = rows[0]
    commands = ", ".join(f"`{name}` {per:.2f}" for name, per in first.commands.items()) or "none"
    whole = math.floor(first.replicas) if math.isfinite(first.replicas) else first.replicas
    lines += [
        "",
        f"Redis commands per call ({first.label}, c={first.concurrency}; `INFO commandstats`, the probe's own "
        f"`INFO` left out): {commands}.",
        "",
        f"Derivation ({first.label}, c={first.concurrency}, {first.calls:,} calls):",
        "",
        f"- one bastion replica on one core serves 1000 / {first.replica_cpu_ms:.3f} ms = "
        f"**{_n(first.replica_rate)} calls/s**;",
        f"- one Redis core serves 1000 / {first.redis_cpu_ms:.4f} ms = **{_n(first.redis_rate)} calls/s** "
        f"(Redis's CPU per call: the increase of `used_cpu_sys + used_cpu_user` over the window ÷ calls);",
        f"- with Redis kept at {pct} of its core: {first.headroom:.2f} × {_n(first.redis_rate)} = "  # noqa: RUF001
        f"{_n(first.headroom * first.redis_rate)} calls/s, ÷ {_n(first.replica_rate)} per replica = "
        f"{first.replicas:.1f}, so **one Redis serves {whole} single-core replicas** before it saturates.",
        "",
        "Assumptions: Redis runs commands on one thread, so it saturates at one core (`io-threads` off, the "
        "default; its total CPU is counted, background threads included); replicas scale linearly, each on a core "
        "of its own, with nothing shared but Redis (not the upstream, not the network); every call is the measured "
        f"one (same pipeline, same tool and arguments); Redis is kept under {pct} of its core, since latency grows "
        "fast as a single-threaded server's queue fills. The round trips here are on loopback: across a network "
        "they cost Redis about the same CPU, and each call more latency.",
    ]
    return "\n".join(lines)
