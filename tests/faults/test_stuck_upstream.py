"""A stdio server that runs but no longer answers is restarted, through a real gateway.

The reviewer's case: call ``f__ok``, then ``f__deaf`` (the server closes its stdin and sleeps) or ``f__freeze``
(it stops reading and answering), then ``f__ok`` again. Its health went ``degraded``, ``down``, its tools were
hidden, and nothing ever restarted it: only a connection that ended made the transport reconnect. Now the
upstream is restarted, answers again from a new process, and ``/readyz``, ``/metrics`` and the log say so.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.procs import descendants, wait_gone
from tests.faults.test_upstream_health import HEALTH, metrics, state, wait_until
from tests.support.gateway import REPO, GatewayProcess
from tests.support.rpc import RpcClient, parse_body

PATIENCE_S = 60.0  # a bound on waiting for what must happen, never a measurement


def gateway(tmp_path: Path, *args: str) -> GatewayProcess:
    command = [sys.executable, "-m", "tests.fixtures.stuck_server", "--record", str(tmp_path / "runs"), *args]
    return GatewayProcess({
        "auth": "none",
        "health": {**HEALTH, "probe_timeout": "1s"},
        "upstreams": {"f": {"command": command, "cwd": str(REPO), "era": "legacy", "timeout": "3s"}},
    }, tmp_path).start()


@pytest.fixture
def client() -> Iterator[list[RpcClient]]:
    made: list[RpcClient] = []
    yield made
    for each in made:
        each.close()


def call(rpc: RpcClient, tool: str) -> dict[str, Any]:
    r = rpc.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": {}}})
    return parse_body(r)[0]


def text(reply: dict[str, Any]) -> str | None:
    result = reply.get("result")
    return result["content"][0]["text"] if result else None


def logged(gw: GatewayProcess, event: str) -> list[dict[str, Any]]:
    return [doc for line in gw.stderr().splitlines() if line.startswith("{")
            for doc in (json.loads(line),) if doc.get("event") == event]


def gauge_state(gw: GatewayProcess) -> list[str]:
    """The states ``bastion_upstream_state`` reports as current (exactly one when it tells the truth)."""
    return [dict(labels)["state"] for (name, labels), value in metrics(gw).items()
            if name == "bastion_upstream_state" and ("upstream", "f") in labels and value == 1]


def restarts(gw: GatewayProcess) -> float:
    return metrics(gw).get(("bastion_upstream_restarts_total", frozenset({("upstream", "f")})), 0.0)


@pytest.mark.parametrize("tool", ["deaf", "freeze"])
def test_an_upstream_that_stops_answering_is_restarted(tool: str, tmp_path: Path,
                                                       client: list[RpcClient]) -> None:
    gw = gateway(tmp_path)
    try:
        rpc = RpcClient(gw.url)
        client.append(rpc)
        rpc.initialize()
        assert text(call(rpc, "f__ok")) == "run 1"
        assert gw.proc is not None
        first = descendants(gw.proc.pid)
        stuck = call(rpc, f"f__{tool}")
        assert "error" in stuck  # it never answers: its call fails (timeout, or the restart ended it)
        # The old process gets the shutdown grace period (2 s) to go: long enough to see the restart under way.
        wait_until(lambda: gauge_state(gw) == ["restarting"], PATIENCE_S, "the metrics never said restarting")
        wait_until(lambda: text(call(rpc, "f__ok")) == "run 2", PATIENCE_S, "never answered again")
        assert state(gw, "f") == "up"
        assert restarts(gw) == 1
        assert not wait_gone(first, PATIENCE_S), "the stuck server was left running"
        if tool == "freeze":  # only its health can tell: restarted because it was down
            reasons = [doc["reason"] for doc in logged(gw, "upstream.restart")]
            assert len(reasons) == 1
            assert reasons[0].startswith("health down: probe failed")
        lost = [doc["detail"] for doc in logged(gw, "upstream.connection_lost")]
        assert len(lost) == 1
    finally:
        gw.stop()


def test_a_server_that_hangs_again_after_each_restart_is_restarted_with_backoff(tmp_path: Path,
                                                                                client: list[RpcClient]) -> None:
    # Runs 2 and 3 answer their handshake and nothing after it; run 4 is healthy.
    gw = gateway(tmp_path, "--stuck-runs", "2,3")
    try:
        rpc = RpcClient(gw.url)
        client.append(rpc)
        rpc.initialize()
        call(rpc, "f__freeze")
        wait_until(lambda: text(call(rpc, "f__ok")) == "run 4", PATIENCE_S, "never answered again")
        assert restarts(gw) == 3
        assert len(logged(gw, "upstream.restart")) == 3
        # The first restart of a connection is immediate; one that hangs again soon after waits longer each time.
        assert [doc["seconds"] for doc in logged(gw, "upstream.reconnect_wait")] == [0.5, 1.0]
    finally:
        gw.stop()
