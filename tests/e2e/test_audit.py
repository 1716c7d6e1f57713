"""The audit log under load: many concurrent calls with mixed outcomes, exactly one record each."""

from __future__ import annotations

import fcntl
import json
import os
import struct
import termios
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bastion.audit.record import arguments_digest
from bastion.auth.apikeys import hash_key
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT, RpcClient

ALICE = "bst_alice_" + "a" * 40
BOB = "bst_bob_" + "b" * 40
POLICY = """\
version: 1
rules:
  - id: alice-basic
    effect: allow
    principals: {ids: [alice]}
    upstreams: [basic, hostile]
  - id: alice-add-limit
    effect: allow
    principals: {ids: [alice]}
    tools: [basic__add]
    limits: [{name: add-limit, rate: 4/minute, burst: 4, per: principal_tool}]
"""


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("audited")
    (workdir / "policies").mkdir()
    (workdir / "policies" / "p.yaml").write_text(POLICY)
    gw = GatewayProcess({
        "auth": {"api_keys": [{"id": "alice", "hash": hash_key(ALICE)}, {"id": "bob", "hash": hash_key(BOB)}]},
        "upstreams": {"basic": stdio_upstream(), "hostile": stdio_upstream("tests.fixtures.hostile_server")},
        "policies": str(workdir / "policies"),
        "audit": {"sinks": [{"file": str(workdir / "audit.jsonl")}]},
    }, workdir).start()
    gw.audit_file = workdir / "audit.jsonl"  # type: ignore[attr-defined]
    yield gw
    gw.stop()


def one_call(url: str, key: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    client = RpcClient(url, {"Authorization": f"Bearer {key}"})
    try:
        client.initialize()
        return client.call(name, arguments)
    finally:
        client.close()


def disconnecting_call(url: str, arguments: dict[str, Any]) -> None:
    """A modern request whose client goes away mid-call: closing the stream cancels the call."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "basic__slow", "arguments": arguments,
                       "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                 "io.modelcontextprotocol/clientCapabilities": {}, "progressToken": "t"}}}
    headers = {"Authorization": f"Bearer {ALICE}", "Accept": ACCEPT, "Content-Type": "application/json",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "basic__slow"}
    with httpx.Client(timeout=30) as http, http.stream("POST", url, json=body, headers=headers) as response:
        for _ in response.iter_lines():
            break  # first progress event seen: hang up


def test_every_call_has_exactly_one_record_whatever_happened(audited: GatewayProcess) -> None:
    calls: list[tuple[str, str, dict[str, Any], str]] = []  # key, tool, arguments, expected outcome
    calls += [(ALICE, "basic__echo", {"message": f"ok-{i}"}, "allowed") for i in range(12)]
    calls += [(BOB, "basic__echo", {"message": f"denied-{i}"}, "denied") for i in range(6)]
    calls += [(ALICE, "basic__nope", {"unknown": i}, "denied") for i in range(3)]
    calls += [(ALICE, "basic__add", {"a": i, "b": 0}, "limited?") for i in range(7)]
    calls += [(ALICE, "hostile__rich", {"bogus": i}, "invalid_input") for i in range(3)]
    calls += [(ALICE, f"hostile__{tool}", {}, "invalid_output") for tool in ("bad_output", "no_structured")]
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda c: one_call(audited.url, c[0], c[1], c[2]), calls))
        pool.submit(disconnecting_call, audited.url, {"seconds": 3, "steps": 30}).result()
    # The upstream crash last: it takes the stdio child down (bastion restarts it).
    crash = one_call(audited.url, ALICE, "basic__crash", {"n": "crash"})
    assert "error" in crash

    limited = sum(1 for (_, tool, _, _), a in zip(calls, answers, strict=True)
                  if tool == "basic__add" and a.get("error", {}).get("code") == -31001)
    assert limited == 3

    total = len(calls) + 2
    records: list[dict[str, Any]] = []
    path: Path = audited.audit_file  # type: ignore[attr-defined]
    for _ in range(200):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        records = [r for r in records if r["event"] == "tool.call"]
        if len(records) >= total:
            break
        time.sleep(0.05)
    assert len(records) == total
    seen = Counter((r["tool"]["name"], r["arguments_digest"]) for r in records)
    for _, tool, arguments, _ in calls:
        assert seen[(tool, arguments_digest(arguments))] == 1, (tool, arguments)

    outcomes = Counter(r["outcome"] for r in records)
    assert outcomes["allowed"] >= 12 + 4
    assert outcomes["denied"] == 9
    assert outcomes["rate_limited"] == 3
    assert outcomes["invalid_input"] == 3
    assert outcomes["invalid_output"] == 2
    assert outcomes["client_disconnected"] == 1
    assert outcomes["upstream_unavailable"] == 1  # the crash: the child died mid-call
    denied = [r for r in records if r["outcome"] == "denied" and r["principal"]["id"] == "bob"]
    assert all(r["stage"] == "policy" for r in denied)
    assert all("b" * 40 not in json.dumps(r) for r in records)  # never a credential


def test_lists_sessions_and_auth_failures_are_audited(audited: GatewayProcess) -> None:
    client = RpcClient(audited.url, {"Authorization": f"Bearer {BOB}"})
    client.initialize()
    assert client.tool_names() == []
    bad = RpcClient(audited.url, {"Authorization": "Bearer bst_nobody_" + "z" * 40})
    assert bad.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}).status_code == 401
    path: Path = audited.audit_file  # type: ignore[attr-defined]
    events = [json.loads(line) for line in path.read_text().splitlines()]
    lists = [e for e in events if e["event"] == "tools.list" and e["principal"]["id"] == "bob"]
    assert lists
    assert lists[-1]["shown"] == 0
    assert lists[-1]["hidden"] > 0
    assert any(e["event"] == "session.start" for e in events)
    failures = [e for e in events if e["event"] == "auth.failure"]
    assert failures
    assert failures[-1]["remote_addr"] == "127.0.0.1"
    assert "z" * 40 not in json.dumps(failures)


def test_metrics_expose_the_expected_series(audited: GatewayProcess) -> None:
    # The previous test crashed the basic child: its gauge is truthfully 0 until the replacement answers.
    deadline = time.monotonic() + 30
    while httpx.get(audited.base + "/readyz", timeout=10).json()["checks"]["upstreams"]["basic"] is not True:
        assert time.monotonic() < deadline, "basic never came back after the crash"
        time.sleep(0.05)
    text = httpx.get(audited.base + "/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("bastion_tool_calls", "bastion_call_overhead_seconds", "bastion_upstream_latency_seconds",
                 "bastion_ratelimit_rejections", "bastion_upstream_up", "bastion_catalogue_tools",
                 "bastion_active_sessions"):
        assert name in families, sorted(families)
    calls = families["bastion_tool_calls"]
    decisions = {s.labels.get("decision") for s in calls.samples}
    assert {"allow", "deny"} <= decisions
    up = {s.labels["upstream"]: s.value for s in families["bastion_upstream_up"].samples}
    assert up.get("basic") == 1.0


def test_a_stalled_stdout_reader_holds_back_what_is_audited_and_nothing_else(tmp_path: Path) -> None:
    """The container default: audit records on stdout, a pipe to a log agent. When the agent stops reading, the
    pipe fills; what waits for its record waits, and the gateway goes on answering everything else."""
    gateway = GatewayProcess({"auth": "none", "upstreams": {"basic": stdio_upstream()}}, tmp_path)
    r, w = os.pipe()
    try:
        gateway.start(stdout=w)
    finally:
        os.close(w)
    calls = 160  # about 900 bytes of record each: well past the pipe's 64 KB
    got = bytearray()
    # The log agent: stalled until told to read, and told so however the test ends (else nothing could finish).
    reading = threading.Event()
    agent = threading.Thread(target=_drain_into, args=(r, got, reading), daemon=True)
    agent.start()

    def caller(n: int) -> int:
        client = RpcClient(gateway.url)
        try:
            client.initialize()
            return sum(1 for i in range(n) if client.call("basic__echo", {"message": f"m{i}"})["result"])
        finally:
            client.close()

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            try:
                done = [pool.submit(caller, calls // 8) for _ in range(8)]
                _wait_until_full(r)
                assert not all(f.done() for f in done)  # the pipe is full: audited calls wait for their records
                # Everything MCP is audited (sessions and lists too) and waits likewise; what is not audited, the
                # probes and the metrics an operator would look at now, is answered.
                started = time.monotonic()
                assert httpx.get(gateway.base + "/healthz", timeout=5).status_code == 200
                assert "bastion_tool_calls_total" in httpx.get(gateway.base + "/metrics", timeout=5).text
                assert time.monotonic() - started < 3.0
            finally:
                reading.set()
            assert sum(f.result(timeout=60) for f in done) == calls
    finally:
        reading.set()
        gateway.stop()
        agent.join(10)
        os.close(r)
    records = [json.loads(line) for line in bytes(got).splitlines()]
    assert Counter(rec["event"] for rec in records)["tool.call"] == calls


def _wait_until_full(fd: int, timeout: float = 60.0) -> None:
    """Until the pipe whose read end is ``fd`` has no room for another record (a record is under 4 KB, and a write
    that small never lands in part), however long the callers take to fill it on this machine."""
    size = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    deadline = time.monotonic() + timeout
    while True:
        held = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        if held > size - 4096:
            return
        assert time.monotonic() < deadline, f"the pipe holds {held} of {size} bytes after {timeout:g} s"
        time.sleep(0.05)


def _drain_into(fd: int, into: bytearray, go: threading.Event) -> None:
    go.wait()
    while chunk := os.read(fd, 65536):
        into.extend(chunk)
