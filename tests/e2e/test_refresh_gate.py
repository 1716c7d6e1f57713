"""A changed definition is never called: the refresh gate and prompt pin approvals, through a running gateway.

The upstream (``tests.fixtures.rugpull_server``) announces ``tools/list_changed`` and rewrites ``transfer`` 50 ms
later, and then answers tools/list slowly, so the window between the announcement and the gateway's new view is
wide. Clients fire calls into that window; the upstream records the definition version each call ran under.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import RpcClient

CATALOGUE_CHANGING = -31010
UNKNOWN_TOOL = -32602


def rug_gateway(workdir: Path, *, list_delay: float, gate_timeout: str = "5s",
                extra: dict[str, Any] | None = None) -> GatewayProcess:
    record = workdir / "rug.jsonl"
    config: dict[str, Any] = {
        "auth": "none",
        "upstreams": {"rug": stdio_upstream("tests.fixtures.rugpull_server", "--record", str(record),
                                            "--list-delay", str(list_delay))},
        "pinning": {"file": str(workdir / "pins.json")},
        # No periodic refresh during a test: whatever happens is caused by the announcement or the approval.
        "catalogue": {"refresh_interval": "1h", "gate_timeout": gate_timeout},
        "audit": {"sinks": ["stdout"]},
        **(extra or {}),
    }
    gw = GatewayProcess(config, workdir).start()
    gw.record_file = record  # type: ignore[attr-defined]
    return gw


def upstream_calls(gw: GatewayProcess) -> list[dict[str, Any]]:
    path: Path = gw.record_file  # type: ignore[attr-defined]
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = rug_gateway(tmp_path, list_delay=0.6)
    yield gw
    gw.stop()


def wait_for_recheck(gw: GatewayProcess, timeout: float = 30.0) -> None:
    """Until the gateway's re-check of the changed upstream has begun (its slow tools/list reached the upstream):
    from then the refresh gate is closed. Waiting for it, not sleeping a guessed time, keeps the tests exact on a
    loaded machine."""
    deadline = time.monotonic() + timeout
    while not any("listing" in c for c in upstream_calls(gw)):
        assert time.monotonic() < deadline, "the gateway never re-listed the changed upstream"
        time.sleep(0.02)


def client(gw: GatewayProcess) -> RpcClient:
    c = RpcClient(gw.url)
    c.initialize()
    return c


def test_calls_racing_a_rug_pull_never_run_the_changed_definition(gateway: GatewayProcess) -> None:
    main = client(gateway)
    assert main.call("rug__transfer", {"amount": 1})["result"]["content"][0]["text"] == "transfer v1"
    stop = threading.Event()
    answers: list[dict[str, Any]] = []

    def hammer() -> None:
        c = client(gateway)
        try:
            while not stop.is_set():
                answers.append(c.call("rug__transfer", {"amount": 5}))
        finally:
            c.close()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert main.call("rug__flip", {})["result"]["content"][0]["text"] == "flipping"
    time.sleep(2.0)  # announcement, debounce, the 0.6 s slow listing, pin check, publish, and then some
    stop.set()
    for t in threads:
        t.join(timeout=30)

    ran = [c for c in upstream_calls(gateway) if c.get("name") == "transfer"]
    assert any(c["switched"] == 2 for c in upstream_calls(gateway) if "switched" in c)
    # The point of it all: calls kept coming while the definition changed, and none ran on the new one.
    assert ran and all(c["version"] == 1 for c in ran), [c for c in ran if c["version"] != 1]
    refused = [a for a in answers if "error" in a]
    assert refused, "the hammer never reached the window"
    assert {a["error"]["code"] for a in refused} <= {UNKNOWN_TOOL, CATALOGUE_CHANGING}
    assert "rug__transfer" not in main.tool_names()
    drift = gateway.wait_records("pin.drift", 1)
    assert drift and drift[-1]["tool"] == "transfer" and drift[-1]["action"] == "blocked"
    main.close()


def test_a_call_in_the_window_waits_for_the_check_and_then_runs(tmp_path: Path) -> None:
    # A 3 s listing: the window stays open long after the client has the flip's answer, even on a loaded box.
    gateway = rug_gateway(tmp_path, list_delay=3.0, gate_timeout="30s")
    c = client(gateway)
    assert c.call("rug__flip", {})["result"]["content"][0]["text"] == "flipping"
    wait_for_recheck(gateway)  # the announcement has arrived and the slow re-listing is under way
    started = time.monotonic()
    answer = c.call("rug__steady", {})
    waited = time.monotonic() - started
    # steady's definition did not change, so after the check it runs, on the re-checked catalogue.
    assert answer["result"]["content"][0]["text"] == "steady v2"
    assert waited >= 0.5, waited  # it waited for the slow listing instead of running at once
    # transfer changed: refused exactly like an unknown tool (it is quarantined).
    assert c.call("rug__transfer", {"amount": 1})["error"]["code"] == UNKNOWN_TOOL
    c.close()
    gateway.stop()


def test_a_check_that_takes_too_long_answers_with_a_clear_error(tmp_path: Path) -> None:
    # The re-check takes 8 s; the call goes in once it has begun, so the answer can only be the gate's timeout.
    gw = rug_gateway(tmp_path, list_delay=8.0, gate_timeout="500ms")
    try:
        c = client(gw)
        c.call("rug__flip", {})
        wait_for_recheck(gw)
        started = time.monotonic()
        answer = c.call("rug__steady", {})
        # Well before the check could have ended: the caller got the gate's answer, it did not wait for the check.
        assert time.monotonic() - started < 6
        error = answer["error"]
        assert error["code"] == CATALOGUE_CHANGING
        assert "still being checked after 0.5 s" in error["message"]
        assert error["data"] == {"upstream": "rug", "tool": "rug__steady", "timeoutMs": 500}
        calls = gw.wait_records("tool.call", 2)
        refused = [r for r in calls if r["tool"]["name"] == "rug__steady"]
        assert refused and refused[-1]["stage"] == "refresh_gate"
        assert "still being checked" in refused[-1]["reason"]
        assert not [x for x in upstream_calls(gw) if x.get("name") == "steady"]
        # Once the check is done the tool answers again.
        deadline = time.monotonic() + 40
        while "error" in (answer := c.call("rug__steady", {})) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answer["result"]["content"][0]["text"] == "steady v2"
        c.close()
    finally:
        gw.stop()


def approve_and_time(gw: GatewayProcess, store_args: list[str]) -> float:
    """Rug-pull ``transfer``, approve it with the real CLI, and return how long until the gateway calls it."""
    c = client(gw)
    c.call("rug__flip", {})
    deadline = time.monotonic() + 15
    while "rug__transfer" in c.tool_names() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "rug__transfer" not in c.tool_names()
    approved = subprocess.run([sys.executable, "-m", "bastion", "pins", "approve", "rug", "transfer", "--by", "admin",
                               *store_args], capture_output=True, text=True, timeout=60)
    assert approved.returncode == 0, approved.stderr
    started = time.monotonic()
    while time.monotonic() - started < 60:
        answer = c.call("rug__transfer", {"amount": 2})
        if "result" in answer:
            assert answer["result"]["content"][0]["text"] == "transfer v2"
            c.close()
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError("the approval never took effect")


def test_an_approval_with_the_file_store_applies_at_once(tmp_path: Path) -> None:
    gw = rug_gateway(tmp_path, list_delay=0.0)
    try:
        took = approve_and_time(gw, ["--config", str(gw.config_path)])
        # The periodic refresh is an hour away: only the file watch can have applied it. About 0.5 s on a quiet
        # machine (poll 0.25 s + debounce 0.2 s, docs/pinning.md); the bound only has to be far below an hour,
        # so a loaded CI box cannot fail it. The figure is printed for the record, not asserted.
        assert took < 20.0, took
        print(f"file store: approval applied after {took:.2f} s")
    finally:
        gw.stop()


def test_an_approval_with_the_redis_store_applies_at_once(tmp_path: Path, redis_server: RedisServer) -> None:
    gw = rug_gateway(tmp_path, list_delay=0.0, extra={"redis": {"url": redis_server.url}})
    try:
        took = approve_and_time(gw, ["--config", str(gw.config_path)])
        assert took < 20.0, took  # far below the hour of the periodic refresh; see the file-store test
        print(f"redis store: approval applied after {took:.2f} s")
    finally:
        gw.stop()
