"""A timeout is a deadline for the caller (issue 14, item 1): real upstream processes frozen with SIGSTOP, one per
transport (stdio, Streamable HTTP in both eras, legacy HTTP+SSE), behind a running gateway.

The caller's error must arrive at the upstream's deadline (plus a generous margin for a loaded CI machine: the
point is "not when the upstream wakes"), its audit record must be written, and the gateway must keep serving the
other upstreams meanwhile. Every frozen process is resumed in teardown, whatever happened.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import LEGACY, stdio_upstream
from tests.support.fixture_server import FixtureServer
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient

TIMEOUT_S = 2.0
MARGIN_S = 1.5


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, FixtureServer]]:
    started = {
        "fhttp": FixtureServer("tests.fixtures.basic_server"),
        "fsse": FixtureServer("tests.fixtures.basic_server", "--transport", "sse"),
        "fmodern": FixtureServer("tests.fixtures.modern_server"),
    }
    yield started
    for server in started.values():
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, servers: dict[str, FixtureServer]) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("deadlines")
    limit = {"timeout": f"{TIMEOUT_S:g}s"}
    gateway = GatewayProcess({
        "auth": "none",
        "upstreams": {
            "ok": stdio_upstream(),
            "fstdio": stdio_upstream(**limit),
            "fhttp": {"url": servers["fhttp"].url, **LEGACY, **limit},
            "fsse": {"url": servers["fsse"].url.replace("/mcp", "/sse"), "transport": "sse", **limit},
            "fmodern": {"url": servers["fmodern"].url, "era": "modern", **limit},
        },
    }, workdir).start()
    yield gateway
    gateway.stop()


def stdio_child(gw: GatewayProcess, index: int) -> int:
    """The pid of the gateway's ``index``-th stdio child (in config order: ok, fstdio)."""
    assert gw.proc is not None
    children = Path(f"/proc/{gw.proc.pid}/task/{gw.proc.pid}/children").read_text().split()
    pids = sorted(int(p) for p in children)
    assert len(pids) >= 2, pids
    return pids[index]


def pid_of(name: str, gw: GatewayProcess, servers: dict[str, FixtureServer]) -> int:
    if name == "fstdio":
        # Children are spawned in config order at start-up, so pids ascend with it.
        return stdio_child(gw, 1)
    return servers[name].proc.pid


def tool_for(name: str) -> tuple[str, dict[str, Any]]:
    return f"{name}__echo", {"message": "are you there?"}


@pytest.mark.parametrize("name", ["fstdio", "fhttp", "fmodern", "fsse"])
def test_a_frozen_upstream_answers_the_caller_at_its_deadline(gw: GatewayProcess,
                                                              servers: dict[str, FixtureServer], name: str) -> None:
    client = RpcClient(gw.url)
    client.initialize()
    tool, args = tool_for(name)
    assert client.call(tool, args).get("result", {}).get("isError") is not True  # it works before the freeze
    records_before = len(gw.records("tool.call"))
    pid = pid_of(name, gw, servers)
    os.kill(pid, signal.SIGSTOP)
    try:
        outcome: dict[str, Any] = {}

        def frozen_call() -> None:
            frozen = RpcClient(gw.url)
            frozen.initialize()
            started = time.monotonic()
            try:
                outcome["answer"] = frozen.call(tool, args)
            except Exception as exc:  # the client's own 30 s read timeout: the gateway never answered
                outcome["answer"] = {"client_error": repr(exc)}
            outcome["elapsed"] = time.monotonic() - started
            frozen.close()

        worker = threading.Thread(target=frozen_call)
        worker.start()
        time.sleep(0.3)
        # Meanwhile, the gateway serves the other upstreams as usual.
        started = time.monotonic()
        healthy = client.call("ok__echo", {"message": "still here"})
        assert healthy["result"]["content"][0]["text"] == "still here"
        assert time.monotonic() - started < MARGIN_S
        worker.join(timeout=TIMEOUT_S + 30)
        assert not worker.is_alive(), "the caller got nothing while the upstream is frozen"
        answer = outcome["answer"]
        assert answer.get("error", {}).get("code") == -31003, answer
        assert "did not answer within 2 s" in answer["error"]["message"]
        assert outcome["elapsed"] < TIMEOUT_S + MARGIN_S, outcome["elapsed"]
        # Its audit record is written, while the upstream is still frozen.
        records = gw.wait_records("tool.call", records_before + 2, timeout=5)
        timed_out = [r for r in records[records_before:] if tool in json.dumps(r)]
        assert len(timed_out) == 1 and timed_out[0]["outcome"] != "ok", timed_out
    finally:
        os.kill(pid, signal.SIGCONT)
    # Once it wakes, it serves again (the clean-up that was bounded in the background did not break it).
    deadline = time.monotonic() + 20
    while True:
        answer = client.call(tool, args)
        if "result" in answer or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert answer.get("result", {}).get("content", [{}])[0].get("text") == "are you there?", answer
    client.close()


def test_shutdown_is_not_held_by_a_frozen_upstream(tmp_path: Path) -> None:
    """Closing the gateway while an HTTP upstream is frozen: the session DELETE and the background clean-up are
    bounded, so the process exits well within its stop grace."""
    server = FixtureServer("tests.fixtures.basic_server")
    gateway = GatewayProcess({"auth": "none", "upstreams": {
        "frozen": {"url": server.url, **LEGACY, "timeout": "1s"}}}, tmp_path).start()
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        client = RpcClient(gateway.url)
        client.initialize()
        assert client.call("frozen__echo", {"message": "x"})["error"]["code"] == -31003
        started = time.monotonic()
        code = gateway.stop(timeout=30)
        assert time.monotonic() - started < 15, "shutdown waited on the frozen upstream"
        assert code is not None
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
        gateway.stop()


assert sys.platform == "linux", "SIGSTOP and /proc are Linux-only here"
