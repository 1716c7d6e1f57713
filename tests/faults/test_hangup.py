"""SIGHUP, what operators and service managers send a daemon to reload, neither kills the gateway nor drops a call:
it reads the policy files at once."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient

ALLOW = "version: 1\nrules:\n  - id: allow-all\n    effect: allow\n"


def _wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def gw(tmp_path: Path) -> Any:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "rules.yaml").write_text(ALLOW)
    record = tmp_path / "calls.jsonl"
    gateway = GatewayProcess({"auth": "none", "policies": str(policies),
                              "upstreams": {"basic": stdio_upstream("tests.fixtures.basic_server", "--record",
                                                                    str(record))}}, tmp_path).start()
    yield gateway
    gateway.stop()


def test_sighup_during_a_call_keeps_serving_and_the_call_completes(gw: GatewayProcess) -> None:
    assert gw.proc is not None
    client = RpcClient(gw.url)
    client.initialize()
    result: dict[str, Any] = {}
    call = threading.Thread(target=lambda: result.update(client.call("basic__slow", {"seconds": 3})))
    call.start()
    record = gw.workdir / "calls.jsonl"
    _wait_for(lambda: record.exists() and "slow" in record.read_text(), "the call never reached the upstream")
    gw.proc.send_signal(signal.SIGHUP)
    call.join(timeout=30)
    # It ended the process at once (exit -1): the call's connection was dropped, its audit record never written.
    assert gw.proc.poll() is None, f"the gateway died on SIGHUP with {gw.proc.returncode}"
    assert result.get("result", {}).get("content") == [{"type": "text", "text": "done"}], result
    _wait_for(lambda: "signal.hangup" in gw.stderr(), "no signal.hangup log line")
    assert "restart to apply changes" in gw.stderr()
    assert [r["outcome"] for r in gw.wait_records("tool.call", 1)] == ["allowed"]


def test_sighup_reads_an_edit_at_once(gw: GatewayProcess) -> None:
    assert gw.proc is not None
    rules = gw.workdir / "policies" / "rules.yaml"
    rules.write_text(ALLOW + "  - id: no-echo\n    effect: deny\n    tools: [basic__echo]\n")
    gw.proc.send_signal(signal.SIGHUP)
    applied = [r for r in gw.wait_records("policy.reload", 1) if r["outcome"] == "applied"]
    assert [r["rules"] for r in applied] == [2]
    assert gw.proc.poll() is None
