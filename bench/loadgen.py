"""Closed-loop MCP load generator: calls/s, latency percentiles, and the server's CPU time per call.

Against servers that already run:

    python bench/loadgen.py --target http://127.0.0.1:8091/mcp,label=direct \\
        --target http://127.0.0.1:8080/mcp,tool=fast__echo,label=bastion,pid=12345 \\
        --concurrency 16 --duration 10

Or let it start everything itself (fast upstream, gateways, Redis, on free loopback ports), one scenario after
the other, and print one Markdown table:

    python bench/loadgen.py --scenario all                  # direct, plain, memory, redis
    python bench/loadgen.py --scenario plain --profile /tmp/prof   # the gateway under cProfile

Each of ``--concurrency`` sessions opens its own keep-alive connection, sends ``initialize`` and
``notifications/initialized`` once, then calls the tool in a closed loop: the next call leaves as soon as the
previous answer is in. After ``--warmup`` seconds the measured window of ``--duration`` seconds (or ``--calls``
calls) starts; the CPU time (utime + stime from ``/proc/<pid>/stat``) of every process named with ``pid=`` is read
at both ends of the window, so "CPU ms per call" is the server's own cost, whatever the machine's load.

The client is a minimal HTTP/1.1 client on asyncio streams, not httpx or the SDK: on a small machine the load
generator shares the cores with what it measures, and a cheap client leaves more of them to the server.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SCENARIOS = BENCH / "scenarios"
PROTOCOL_VERSION = "2025-06-18"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """A benchmark could not run (a server did not start, a session could not open)."""


# -- a minimal HTTP/1.1 client ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: Mapping[str, str]
    body: bytes


class HttpConnection:
    """One keep-alive connection; requests are sent one at a time. Content-Length and chunked bodies."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise BenchError(f"only http:// URLs are supported: {url}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.authority = f"{self.host}:{self.port}"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        try:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            raise BenchError(f"cannot connect to {self.authority}: {exc.strerror or exc}") from exc
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def post(self, body: bytes, headers: Mapping[str, str]) -> HttpAnswer:
        if self.writer is None:
            await self._connect()
        assert self.reader is not None
        assert self.writer is not None
        head = [f"POST {self.path} HTTP/1.1", f"Host: {self.authority}", f"Content-Length: {len(body)}"]
        head.extend(f"{k}: {v}" for k, v in headers.items())
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        try:
            return await self._read()
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self.close()
            raise BenchError(f"connection to {self.authority} ended: {exc!r}") from exc

    async def _read(self) -> HttpAnswer:
        assert self.reader is not None
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw[:-4].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                chunks.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            body = b"".join(chunks)
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return HttpAnswer(status, headers, body)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.reader = None


# -- one MCP session ----------------------------------------------------------------------------------------------


def decode_rpc(answer: HttpAnswer) -> dict[str, Any]:
    """The JSON-RPC message of a POST answer, whether sent as JSON or as an SSE stream (its last message)."""
    if answer.status != 200:
        raise BenchError(f"HTTP {answer.status}: {answer.body[:200]!r}")
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in answer.body.split(b"\n") if line.startswith(b"data:")]
        if not data:
            raise BenchError("event stream without a message")
        message = orjson.loads(data[-1])
    else:
        message = orjson.loads(answer.body)
    if not isinstance(message, dict):
        raise BenchError(f"not a JSON-RPC object: {answer.body[:200]!r}")
    return message


class McpSession:
    def __init__(self, url: str, headers: Mapping[str, str] | None = None) -> None:
        self.conn = HttpConnection(url)
        # ``headers``: sent on every request, e.g. the API key of a gateway that authenticates its callers.
        self.headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                        **(headers or {})}
        self.next_id = 0

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """One JSON-RPC request on this session; its answer (``result`` or ``error``)."""
        return await self._request(method, params)

    async def _request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        body = orjson.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        return decode_rpc(await self.conn.post(body, self.headers))

    async def open(self) -> None:
        self.next_id += 1
        body = orjson.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "bastion-loadgen", "version": "1"}}})
        answer = await self.conn.post(body, self.headers)
        message = decode_rpc(answer)
        if "result" not in message:
            raise BenchError(f"initialize failed: {message.get('error')}")
        sid = answer.headers.get("mcp-session-id")
        if sid is not None:
            self.headers["Mcp-Session-Id"] = sid
        self.headers["MCP-Protocol-Version"] = str(message["result"].get("protocolVersion", PROTOCOL_VERSION))
        note = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ack = await self.conn.post(note, self.headers)
        if ack.status not in (200, 202):
            raise BenchError(f"notifications/initialized answered HTTP {ack.status}")

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> str | None:
        """None when the call succeeded, else a short description of what went wrong."""
        message = await self._request("tools/call", {"name": tool, "arguments": arguments})
        if "error" in message:
            return f"JSON-RPC error {message['error'].get('code')}: {message['error'].get('message')}"
        result = message.get("result")
        if not isinstance(result, dict) or result.get("isError"):
            return f"tool error: {orjson.dumps(result)[:200]!r}"
        return None

    async def close(self) -> None:
        await self.conn.close()


# -- measuring ----------------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (clock-tick resolution, 10 ms on Linux)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


Probe = Callable[[], Mapping[str, float]]
"""Cumulative counters a server keeps of itself (Redis's ``INFO``), read at both ends of the window like /proc."""


@dataclass(frozen=True)
class Target:
    url: str
    tool: str = "echo"
    label: str = ""
    pids: Mapping[str, int] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    probes: Mapping[str, Probe] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str, default_tool: str) -> Target:
        """``URL[,tool=NAME][,label=TEXT][,pid=PID][,upstream-pid=PID]``."""
        url, *options = spec.split(",")
        tool, label, pids = default_tool, url, {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep:
                raise BenchError(f"target option {option!r} must be key=value")
            if key == "tool":
                tool = value
            elif key == "label":
                label = value
            elif key in ("pid", "upstream-pid"):
                pids["gateway" if key == "pid" else "upstream"] = int(value)
            else:
                raise BenchError(f"unknown target option {key!r} (tool, label, pid, upstream-pid)")
        return cls(url=url, tool=tool, label=label, pids=pids)


@dataclass(frozen=True)
class LoadSpec:
    concurrency: int = 16
    duration: float = 10.0
    warmup: float = 2.0
    calls: int | None = None
    arguments: Mapping[str, Any] = field(default_factory=lambda: {"text": "hello"})


@dataclass(frozen=True)
class Result:
    label: str
    calls: int
    errors: int
    elapsed: float
    latencies_ms: Sequence[float]
    cpu_s: Mapping[str, float]
    loadgen_cpu_s: float
    first_error: str | None = None
    counters: Mapping[str, float] = field(default_factory=dict)  # "probe:counter" -> its increase in the window

    @property
    def rate(self) -> float:
        return self.calls / self.elapsed if self.elapsed > 0 else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    def cpu_ms_per_call(self, role: str) -> float | None:
        if role not in self.cpu_s or self.calls == 0:
            return None
        return self.cpu_s[role] * 1000 / self.calls

    def per_call(self, counter: str) -> float | None:
        if counter not in self.counters or self.calls == 0:
            return None
        return self.counters[counter] / self.calls


def read_probes(probes: Mapping[str, Probe]) -> dict[str, float]:
    return {f"{name}:{key}": value for name, probe in probes.items() for key, value in probe().items()}


def increase(start: Mapping[str, float], end: Mapping[str, float]) -> dict[str, float]:
    """Per counter, end minus start; one that first appears in the window (a command's first call) started at 0."""
    return {key: value - start.get(key, 0.0) for key, value in end.items()}


class Window:
    """The measured window, shared by all workers of one run."""

    def __init__(self, spec: LoadSpec, pids: Mapping[str, int], probes: Mapping[str, Probe] | None = None) -> None:
        self.spec = spec
        self.pids = pids
        self.probes = probes or {}
        self.counters_start: dict[str, float] = {}
        self.counters_end: dict[str, float] = {}
        self.measuring = False
        self.stopping = False
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error: str | None = None
        self.full = asyncio.Event()
        self.cpu_start: dict[str, float] = {}
        self.cpu_end: dict[str, float] = {}
        self.t_start = self.t_end = 0.0
        self.lg_start = self.lg_end = 0.0

    def open(self) -> None:
        self.counters_start = read_probes(self.probes)
        self.cpu_start = {role: cpu_seconds(pid) for role, pid in self.pids.items()}
        self.lg_start = time.process_time()
        self.t_start = time.perf_counter()
        self.measuring = True

    def close(self) -> None:
        if not self.measuring:
            return
        self.measuring = False
        self.t_end = time.perf_counter()
        self.lg_end = time.process_time()
        self.cpu_end = {role: cpu_seconds(pid) for role, pid in self.pids.items()}
        self.counters_end = read_probes(self.probes)

    def record(self, latency_ms: float, error: str | None) -> None:
        if not self.measuring:
            return
        self.latencies.append(latency_ms)
        if error is not None:
            self.errors += 1
            self.first_error = self.first_error or error
        if self.spec.calls is not None and len(self.latencies) >= self.spec.calls:
            self.close()
            self.full.set()


async def worker(target: Target, window: Window, ready: asyncio.Barrier) -> None:
    session = McpSession(target.url, target.headers)
    try:
        await session.open()
        await ready.wait()
        arguments = window.spec.arguments
        while not window.stopping:
            t0 = time.perf_counter()
            try:
                error = await session.call(target.tool, arguments)
            except BenchError as exc:
                error = str(exc)
                await session.close()
                session = McpSession(target.url, target.headers)
                await session.open()
            window.record((time.perf_counter() - t0) * 1000, error)
    finally:
        await session.close()


async def run_load(target: Target, spec: LoadSpec) -> Result:
    window = Window(spec, target.pids, target.probes)
    ready = asyncio.Barrier(spec.concurrency + 1)
    tasks = [asyncio.create_task(worker(target, window, ready)) for _ in range(spec.concurrency)]
    try:
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:  # a session failed to open
            waiter.cancel()
            for task in done:
                task.result()
        await asyncio.sleep(spec.warmup)
        window.open()
        with suppress(TimeoutError):
            await asyncio.wait_for(window.full.wait(), timeout=spec.duration)
        window.close()
    finally:
        window.stopping = True
        await asyncio.gather(*tasks, return_exceptions=True)
    cpu = {role: window.cpu_end[role] - window.cpu_start[role] for role in window.cpu_start}
    return Result(label=target.label, calls=len(window.latencies), errors=window.errors,
                  elapsed=window.t_end - window.t_start, latencies_ms=window.latencies, cpu_s=cpu,
                  loadgen_cpu_s=window.lg_end - window.lg_start, first_error=window.first_error,
                  counters=increase(window.counters_start, window.counters_end))


# -- reporting ----------------------------------------------------------------------------------------------------


def _ms(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown_table(results: Sequence[Result]) -> str:
    """One row per run; the first row is the baseline the 'added' columns compare with."""
    rows = ["| scenario | calls/s | p50 ms | p90 ms | p99 ms | errors | gateway CPU ms/call | "
            "upstream CPU ms/call | loadgen CPU ms/call | added p50 ms | calls/s vs first |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = results[0] if results else None
    for r in results:
        lg = r.loadgen_cpu_s * 1000 / r.calls if r.calls else None
        added = None if base is None or r is base else r.percentile(50) - base.percentile(50)
        ratio = None if base is None or r is base or base.rate == 0 else r.rate / base.rate
        rows.append(f"| {r.label} | {r.rate:,.0f} | {_ms(r.percentile(50))} | {_ms(r.percentile(90))} | "
                    f"{_ms(r.percentile(99))} | {r.errors} | {_ms(r.cpu_ms_per_call('gateway'), 3)} | "
                    f"{_ms(r.cpu_ms_per_call('upstream'), 3)} | {_ms(lg, 3)} | "
                    f"{'—' if added is None else f'{added:+.2f}'} | {'—' if ratio is None else f'{ratio:.0%}'} |")
    return "\n".join(rows)


def machine_summary() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPU(s) ({model}), "
            f"Python {platform.python_version()}, load average {load}")


def describe(result: Result) -> str:
    line = f"{result.label}: {result.calls} calls in {result.elapsed:.1f} s, {result.errors} errors"
    if result.cpu_s:
        line += ", CPU ms/call " + ", ".join(f"{role} {result.cpu_ms_per_call(role) or 0:.3f}"
                                             for role in sorted(result.cpu_s))
    if result.first_error:
        line += f" (first: {result.first_error})"
    return line


# -- processes for --scenario -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"nothing listening on port {port} after {timeout:.0f} s")


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"bastion exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise BenchError(f"bastion not ready after {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def running(args: list[str], *, port: int, cwd: Path = REPO, stdout: Any = subprocess.DEVNULL,
            stderr: Any = subprocess.DEVNULL) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, cwd=cwd, stdout=stdout, stderr=stderr)
    try:
        wait_port(port, proc)
        yield proc
    finally:
        stop(proc)


@dataclass(frozen=True)
class Scenario:
    name: str
    label: str
    config: Path | None  # None: call the upstream directly
    needs_redis: bool = False
    needs_otlp: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    upstream_args: tuple[str, ...] = ()


SCENARIO_ORDER = ("direct", "plain", "memory", "redis")
# A scenario file's comment lines may say more than its config can: the row's name in the table, a header every
# session sends (an API key, whose hash is in the config), and options for upstream_fast.py (such as --structured).
LABEL_COMMENT = "# bench-label:"
HEADER_COMMENT = "# bench-header:"
UPSTREAM_COMMENT = "# bench-upstream:"


def _comments(text: str, prefix: str) -> list[str]:
    return [line[len(prefix):].strip() for line in text.splitlines() if line.startswith(prefix)]


def load_scenarios() -> dict[str, Scenario]:
    found = {"direct": Scenario("direct", "upstream direct", None)}
    for path in sorted(SCENARIOS.glob("*.yaml")):
        text = path.read_text()
        label = next(iter(_comments(text, LABEL_COMMENT)), path.stem)
        headers = dict(tuple(part.strip() for part in h.split(":", 1)) for h in _comments(text, HEADER_COMMENT))
        upstream_args = tuple(arg for line in _comments(text, UPSTREAM_COMMENT) for arg in line.split())
        doc = yaml.safe_load(text)
        found[path.stem] = Scenario(path.stem, label, path, needs_redis="redis" in doc,
                                    needs_otlp="tracing" in doc, headers=headers, upstream_args=upstream_args)
    return found


def gateway_config(scenario: Scenario, *, port: int, upstream_url: str, redis_url: str | None,
                   otlp_url: str | None = None) -> dict[str, Any]:
    """The scenario's YAML with the run's addresses filled in (ports are chosen per run)."""
    assert scenario.config is not None
    doc: dict[str, Any] = yaml.safe_load(scenario.config.read_text())
    doc["listen"] = {**doc.get("listen", {}), "host": "127.0.0.1", "port": port}
    for upstream in doc.get("upstreams", {}).values():
        upstream["url"] = upstream_url
    if "redis" in doc:
        if redis_url is None:
            raise BenchError(f"scenario {scenario.name} needs Redis")
        doc["redis"] = {**doc["redis"], "url": redis_url}
    if "tracing" in doc:
        if otlp_url is None:
            raise BenchError(f"scenario {scenario.name} needs an OTLP receiver")
        doc["tracing"] = {**doc["tracing"], "otlp_endpoint": otlp_url}
    if "policies" in doc:
        doc["policies"] = str((scenario.config.parent / doc["policies"]).resolve())
    return doc


def place_audit_files(doc: dict[str, Any], work: Path) -> dict[str, Any]:
    """The config with relative audit file sinks moved into the run's work directory: the gateway opens them
    relative to its working directory (the repository), where a benchmark must leave nothing behind."""
    for sink in (doc.get("audit") or {}).get("sinks") or []:
        if isinstance(sink, dict) and "file" in sink and not Path(sink["file"]).is_absolute():
            sink["file"] = str(work / sink["file"])
    return doc


def print_profile(path: Path, top: int) -> None:
    import pstats

    stats = pstats.Stats(str(path), stream=sys.stderr)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def merge(results: Sequence[Result]) -> list[Result]:
    """Pool the rounds of each scenario into one result (calls, time and CPU summed; latencies together)."""
    by_label: dict[str, list[Result]] = {}
    for r in results:
        by_label.setdefault(r.label, []).append(r)
    return [Result(label=label, calls=sum(r.calls for r in rs), errors=sum(r.errors for r in rs),
                   elapsed=sum(r.elapsed for r in rs), latencies_ms=[x for r in rs for x in r.latencies_ms],
                   cpu_s={role: sum(r.cpu_s[role] for r in rs) for role in rs[0].cpu_s},
                   loadgen_cpu_s=sum(r.loadgen_cpu_s for r in rs),
                   first_error=next((r.first_error for r in rs if r.first_error), None),
                   counters={key: sum(r.counters.get(key, 0.0) for r in rs)
                             for key in {k for r in rs for k in r.counters}})
            for label, rs in by_label.items()]


def run_scenarios(names: Sequence[str], spec: LoadSpec, *, upstream_impl: str, profile: Path | None,
                  top: int, rounds: int = 1) -> list[Result]:
    """Each scenario in turn, ``rounds`` times over (interleaved, so a burst of load elsewhere on the machine
    spreads over all scenarios instead of landing on one), pooled per scenario."""
    available = load_scenarios()
    unknown = [n for n in names if n not in available]
    if unknown:
        raise BenchError(f"unknown scenario(s) {unknown}; known: {sorted(available)}")
    chosen = [available[n] for n in names]
    results: list[Result] = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bastion-bench-")))
        # One upstream per distinct set of options the chosen scenarios ask for ("direct" takes the plain one).
        upstreams: dict[tuple[str, ...], tuple[subprocess.Popen[bytes], str]] = {}
        for options in dict.fromkeys(s.upstream_args for s in chosen):
            up_port = free_port()
            upstreams[options] = (stack.enter_context(running(
                [sys.executable, str(BENCH / "upstream_fast.py"), "--port", str(up_port), "--impl", upstream_impl,
                 *options], port=up_port)), f"http://127.0.0.1:{up_port}/mcp")
        redis_url = None
        extra_pids: dict[str, int] = {}
        if any(s.needs_redis for s in chosen):
            exe = shutil.which("redis-server")
            if exe is None:
                raise BenchError("redis-server not found (the redis scenario needs it)")
            redis_port = free_port()
            redis = stack.enter_context(running(
                [exe, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(work)], port=redis_port))
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            extra_pids["redis"] = redis.pid
        otlp_url = None
        if any(s.needs_otlp for s in chosen):
            # A real OTLP/HTTP receiver (decodes every export with opentelemetry-proto): the exporter's cost is
            # measured against a peer that answers like a collector, not against a refused connection.
            otlp_port = free_port()
            stack.enter_context(running(
                [sys.executable, "-m", "tests.support.otlp_receiver", "--port", str(otlp_port), "--out",
                 str(work / "spans.jsonl")], port=otlp_port))
            otlp_url = f"http://127.0.0.1:{otlp_port}"
        for scenario in [s for _ in range(rounds) for s in chosen]:
            upstream, upstream_url = upstreams[scenario.upstream_args]
            if scenario.config is None:
                target = Target(url=upstream_url, tool="echo", label=scenario.label,
                                pids={"upstream": upstream.pid})
                print(f"running {scenario.name} ...", file=sys.stderr, flush=True)
                results.append(asyncio.run(run_load(target, spec)))
                print(describe(results[-1]), file=sys.stderr, flush=True)
                continue
            pids = {"upstream": upstream.pid, **(extra_pids if scenario.needs_redis else {})}
            results.append(run_gateway_scenario(scenario, spec, work, pids, upstream_url, redis_url, profile, top,
                                                otlp_url))
    return merge(results)


def run_gateway_scenario(scenario: Scenario, spec: LoadSpec, work: Path, pids: Mapping[str, int],
                         upstream_url: str, redis_url: str | None, profile: Path | None, top: int,
                         otlp_url: str | None = None) -> Result:
    port = free_port()
    config = work / f"{scenario.name}.yaml"
    config.write_text(yaml.safe_dump(place_audit_files(gateway_config(
        scenario, port=port, upstream_url=upstream_url, redis_url=redis_url, otlp_url=otlp_url), work),
        sort_keys=False))
    command = [sys.executable]
    prof_path = None
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        prof_path = profile / f"{scenario.name}.prof"
        command += ["-m", "cProfile", "-o", str(prof_path)]
    command += ["-m", "bastion", "serve", "--config", str(config), "--grace", "5"]
    log = work / f"{scenario.name}.err"
    print(f"running {scenario.name} ...", file=sys.stderr, flush=True)
    # The audit records (stdout) go to a file, as a deployment would keep them.
    with (work / f"{scenario.name}.audit").open("wb") as audit, log.open("wb") as err:
        proc = subprocess.Popen(command, cwd=REPO, stdout=audit, stderr=err)
        try:
            wait_ready(f"http://127.0.0.1:{port}/readyz", proc, log)
            target = Target(url=f"http://127.0.0.1:{port}/mcp", tool="fast__echo", label=scenario.label,
                            pids={"gateway": proc.pid, **pids}, headers=scenario.headers)
            result = asyncio.run(run_load(target, spec))
        finally:
            # uvicorn re-raises the signal it stopped on; SIGINT ends as KeyboardInterrupt, which lets cProfile
            # write its file, where SIGTERM's default action would kill the process first.
            stop(proc, sig=signal.SIGINT if profile is not None else signal.SIGTERM)
    print(describe(result), file=sys.stderr, flush=True)
    if result.errors:
        print(log.read_text(errors="replace")[-2000:], file=sys.stderr)
    if prof_path is not None and prof_path.exists():
        print_profile(prof_path, top)
    return result


# -- command line -------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--target", action="append", metavar="URL[,tool=T][,label=L][,pid=P][,upstream-pid=P]",
                      help="an MCP endpoint to load (repeatable; run one after the other, the first is the baseline)")
    mode.add_argument("--scenario", action="append", metavar="NAME",
                      help=f"start everything and run a scenario: all, {', '.join(SCENARIO_ORDER)}, or the name "
                           "of a YAML file in bench/scenarios (repeatable)")
    parser.add_argument("--tool", default="echo", help="tool to call for --target (default: echo)")
    parser.add_argument("--args", default='{"text": "hello"}', help="tool arguments as JSON")
    parser.add_argument("--gateway-pid", type=int, help="measure this process's CPU time for every --target")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent sessions (default: 16)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default: 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run (default: 2)")
    parser.add_argument("--calls", type=int, help="end a run after this many measured calls")
    parser.add_argument("--rounds", type=int, default=1,
                        help="--scenario: run the list this many times, interleaved, and pool each scenario's rounds")
    parser.add_argument("--upstream-impl", choices=["raw", "sdk"], default="raw",
                        help="--scenario: the upstream (raw: minimal asyncio server; sdk: the mcp SDK's server)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="--scenario: run each gateway under cProfile, write DIR/<scenario>.prof, print the top")
    parser.add_argument("--top", type=int, default=25, help="rows of each profile listing (default: 25)")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.duration <= 0 or args.warmup < 0 or args.rounds < 1:
        parser.error("--concurrency and --rounds must be >= 1, --duration > 0, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        arguments = orjson.loads(args.args)
        if not isinstance(arguments, dict):
            raise BenchError("--args must be a JSON object")
        spec = LoadSpec(concurrency=args.concurrency, duration=args.duration, warmup=args.warmup,
                        calls=args.calls, arguments=arguments)
        if args.scenario:
            names = [n for s in args.scenario for n in (SCENARIO_ORDER if s == "all" else (s,))]
            results = run_scenarios(names, spec, upstream_impl=args.upstream_impl, profile=args.profile,
                                    top=args.top, rounds=args.rounds)
        else:
            results = []
            for spec_text in args.target:
                target = Target.parse(spec_text, args.tool)
                if args.gateway_pid is not None and "gateway" not in target.pids:
                    target = Target(target.url, target.tool, target.label,
                                    {**target.pids, "gateway": args.gateway_pid})
                print(f"running {target.label} ...", file=sys.stderr, flush=True)
                results.append(asyncio.run(run_load(target, spec)))
                print(describe(results[-1]), file=sys.stderr, flush=True)
    except (BenchError, orjson.JSONDecodeError, OSError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 1
    print(f"\nMachine: {machine_summary()}")
    rounds = f" x {args.rounds} rounds" if args.scenario and args.rounds > 1 else ""
    print(f"Load: concurrency {spec.concurrency}, {spec.duration:g} s measured after {spec.warmup:g} s warm-up "
          f"per run{rounds}, arguments {orjson.dumps(spec.arguments).decode()}\n")
    print(markdown_table(results))
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
