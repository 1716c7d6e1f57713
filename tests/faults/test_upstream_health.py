"""Health tells the truth: real upstream processes killed under a running gateway.

At every step the test reads what an operator reads (``/readyz``, ``/metrics``, the audit log) and what a
connected client sees (``tools/list``, ``list_changed``, the error of a call), and measures how long detection and
recovery took (printed with ``-s``; the figures in docs/operations.md come from here).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.shared.subscriptions import ToolsListChanged
from prometheus_client.parser import text_string_to_metric_families

from tests.faults.procs import cmdline, descendants
from tests.support.fixture_server import FixtureServer
from tests.support.gateway import REPO, GatewayProcess
from tests.support.net import wait_for_port

HEALTH = {"probe_interval": "500ms", "recovery_interval": "200ms", "probe_jitter": 0.1, "probe_timeout": "3s",
          "failures_to_down": 2, "hide_after": "1s"}


def readyz(gw: GatewayProcess) -> tuple[int, dict[str, Any]]:
    r = httpx.get(gw.base + "/readyz", timeout=5)
    return r.status_code, r.json()


def metrics(gw: GatewayProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(gw.base + "/metrics", timeout=5).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_until(what: Callable[[], bool], timeout: float, message: str) -> float:
    """Seconds it took for ``what`` to hold; fails after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if what():
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"{message} (after {timeout}s)")


def state(gw: GatewayProcess, upstream: str) -> str:
    return str(readyz(gw)[1]["checks"]["upstream_health"][upstream]["state"])


class ListChanges:
    """Counts the tools/list_changed notifications a connected SDK client receives."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/tools/list_changed":
            self.count += 1

    async def wait_for(self, count: int, timeout: float = 10.0) -> None:
        with anyio.fail_after(timeout):
            while self.count < count:
                await anyio.sleep(0.02)


@pytest.fixture
def slow_restart_flag(tmp_path: Path) -> Path:
    return tmp_path / "restart-slowly"


@pytest.fixture
def web(tmp_path: Path) -> Iterator[FixtureServer]:
    server = FixtureServer()
    yield server
    if server.proc.poll() is None:
        server.stop()


@pytest.fixture
def gw(tmp_path: Path, web: FixtureServer, slow_restart_flag: Path) -> Iterator[GatewayProcess]:
    # The stdio child sleeps before starting whenever the flag exists, so a restart lasts long enough for the
    # test to observe "restarting" deterministically.
    stdio = ["/bin/sh", "-c", f'[ -e "{slow_restart_flag}" ] && sleep 2; exec "{sys.executable}" -m '
             "tests.fixtures.basic_server --transport stdio"]
    gateway = GatewayProcess({
        "auth": "none",
        "health": HEALTH,
        "upstreams": {
            "basic": {"command": stdio, "cwd": str(REPO), "era": "legacy"},
            "web": {"url": web.url, "era": "legacy", "timeout": "5s"},
        },
    }, tmp_path).start()
    yield gateway
    gateway.stop()


def restart(server: FixtureServer) -> None:
    restart_fixture(server, "tests.fixtures.basic_server")


def restart_fixture(server: FixtureServer, module: str) -> None:
    server.proc = subprocess.Popen(
        [sys.executable, "-m", module, "--transport", "streamable-http", "--port",
         str(server.port)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(server.port, timeout=60)  # a loaded machine can take long to start Python and the SDK


def up(m: dict[tuple[str, frozenset[tuple[str, str]]], float], upstream: str) -> float:
    return m[("bastion_upstream_up", frozenset({("upstream", upstream)}))]


def in_state(m: dict[tuple[str, frozenset[tuple[str, str]]], float], upstream: str, name: str) -> float:
    return m[("bastion_upstream_state", frozenset({("upstream", upstream), ("state", name)}))]


def transitions(m: dict[tuple[str, frozenset[tuple[str, str]]], float], upstream: str, name: str) -> float:
    return m.get(("bastion_upstream_transitions_total", frozenset({("upstream", upstream), ("state", name)})), 0.0)


async def test_a_killed_http_upstream_is_reported_hidden_refused_fast_and_recovered(
        gw: GatewayProcess, web: FixtureServer) -> None:
    time.sleep(1.2)  # two probe intervals: the probe itself must never make a healthy upstream look ill
    status, body = readyz(gw)
    assert status == 200 and body["checks"]["upstream_health"]["web"]["state"] == "up"
    m = metrics(gw)
    assert up(m, "web") == 1 and transitions(m, "web", "degraded") == 0 and transitions(m, "web", "down") == 0
    changes = ListChanges()
    async with Client(gw.url, mode="legacy", message_handler=changes) as client:
        assert "web__echo" in {t.name for t in (await client.list_tools()).tools}
        # The SDK opens its GET stream in the background; a notification sent before it is open is lost. A
        # change of our own, seen arriving, proves the stream is there before the fault is injected.
        with anyio.fail_after(30):
            while changes.count == 0:
                await client.call_tool("basic__grow", {})
                with anyio.move_on_after(1):
                    await changes.wait_for(1)
        await anyio.sleep(0.5)  # let the last grow's refresh settle, so its notification is not counted below
        seen = changes.count

        # 1. Kill the HTTP upstream; no traffic: the active probe alone must notice.
        web.proc.send_signal(signal.SIGKILL)
        web.proc.wait()
        detect = await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: state(gw, "web") == "down", 10, "web never reported down"))
        status, body = readyz(gw)
        health = body["checks"]["upstream_health"]["web"]
        assert status == 200  # basic still serves
        assert body["checks"]["upstreams"]["web"] is False
        assert "probe failed" in health["reason"] and health["since"].endswith("+00:00")
        m = metrics(gw)
        assert up(m, "web") == 0 and in_state(m, "web", "down") == 1 and in_state(m, "web", "up") == 0
        assert transitions(m, "web", "down") == 1

        # 2. Calls fail fast with -31002 and are audited as such.
        with pytest.raises(Exception) as failure:
            await client.call_tool("web__echo", {"message": "x"})
        assert getattr(getattr(failure.value, "error", None), "code", None) == -31002, repr(failure.value)
        records = gw.wait_records("tool.call", 1)
        assert records[-1]["outcome"] == "upstream_unavailable"

        # 3. After the grace its tools leave the list, and the connected client is told.
        await changes.wait_for(seen + 1)
        names = {t.name for t in (await client.list_tools()).tools}
        assert not any(n.startswith("web__") for n in names) and "basic__echo" in names
        assert readyz(gw)[1]["checks"]["upstream_health"]["web"]["tools_hidden"] is True

        # 4. The upstream comes back: detected by the probe, tools back, client told, calls work.
        restart(web)
        recover = await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: state(gw, "web") == "up", 10, "web never came back"))
        await changes.wait_for(seen + 2)
        names = {t.name for t in (await client.list_tools()).tools}
        assert "web__echo" in names
        result = await client.call_tool("web__echo", {"message": "back"})
        assert result.content[0].text == "back"
        m = metrics(gw)
        assert up(m, "web") == 1 and in_state(m, "web", "up") == 1 and transitions(m, "web", "up") >= 1

        # 5. Killed again, now under traffic: the failed call itself starts the confirming probe.
        web.proc.send_signal(signal.SIGKILL)
        web.proc.wait()
        killed = time.monotonic()
        with pytest.raises(Exception) as failure:
            await client.call_tool("web__echo", {"message": "x"})
        assert getattr(getattr(failure.value, "error", None), "code", None) == -31002
        await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: state(gw, "web") == "down", 10, "web never reported down"))
        under_traffic = time.monotonic() - killed
    print(f"\nhttp upstream killed: idle, down after {detect:.2f}s; under traffic, down after {under_traffic:.2f}s; "
          f"listening again: up after {recover:.2f}s")


async def test_a_killed_stdio_child_is_restarting_until_its_replacement_answers(
        gw: GatewayProcess, slow_restart_flag: Path) -> None:
    assert gw.proc is not None
    children = [p for p in descendants(gw.proc.pid) if "basic_server" in cmdline(p)]
    assert len(children) == 1, children
    slow_restart_flag.touch()
    os.kill(children[0], signal.SIGKILL)
    detect = await anyio.to_thread.run_sync(
        lambda: wait_until(lambda: state(gw, "basic") == "restarting", 5, "never reported restarting"))
    status, body = readyz(gw)
    health = body["checks"]["upstream_health"]["basic"]
    assert "exit code -9" in health["reason"]
    assert status == 200  # web still serves
    m = metrics(gw)
    assert up(m, "basic") == 0 and in_state(m, "basic", "restarting") == 1
    assert m[("bastion_upstream_restarts_total", frozenset({("upstream", "basic")}))] == 1
    slow_restart_flag.unlink()
    async with Client(gw.url, mode="legacy") as client:
        # A call made while the replacement starts waits for it (within its timeout) instead of failing.
        result = await client.call_tool("basic__echo", {"message": "during restart"})
    assert result.content[0].text == "during restart"
    await anyio.to_thread.run_sync(
        lambda: wait_until(lambda: state(gw, "basic") == "up", 15, "basic never came back"))
    assert up(metrics(gw), "basic") == 1
    print(f"\nstdio child killed: restarting after {detect:.2f}s")


@pytest.fixture
def modern_web() -> Iterator[FixtureServer]:
    server = FixtureServer("tests.fixtures.modern_server")
    yield server
    if server.proc.poll() is None:
        server.stop()


async def test_a_killed_modern_http_upstream_is_probed_with_discover_and_listeners_are_told(
        tmp_path: Path, modern_web: FixtureServer) -> None:
    gw = GatewayProcess({"auth": "none", "health": HEALTH,
                         "upstreams": {"modern": {"url": modern_web.url, "era": "modern"}}}, tmp_path).start()
    try:
        await anyio.sleep(1.2)  # server/discover probes of a healthy modern upstream keep it up
        m = metrics(gw)
        assert in_state(m, "modern", "up") == 1 and transitions(m, "modern", "degraded") == 0
        async with Client(gw.url) as client, client.listen(tools_list_changed=True) as subscription:
            assert client.protocol_version == "2026-07-28"
            assert any(t.name.startswith("modern__") for t in (await client.list_tools()).tools)
            modern_web.proc.send_signal(signal.SIGKILL)
            modern_web.proc.wait()
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: state(gw, "modern") == "down", 10, "modern never reported down"))
            assert readyz(gw)[0] == 503  # its only upstream is down: the replica must leave the Service
            with anyio.fail_after(10):
                assert isinstance(await subscription.__anext__(), ToolsListChanged)
            assert (await client.list_tools()).tools == []
            with pytest.raises(Exception) as failure:
                await client.call_tool("modern__echo", {"message": "x"})
            assert getattr(getattr(failure.value, "error", None), "code", None) == -31002
            restart_fixture(modern_web, "tests.fixtures.modern_server")
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: state(gw, "modern") == "up", 10, "modern never came back"))
            with anyio.fail_after(10):
                assert isinstance(await subscription.__anext__(), ToolsListChanged)
            assert any(t.name.startswith("modern__") for t in (await client.list_tools()).tools)
        assert readyz(gw)[0] == 200
    finally:
        gw.stop()


@pytest.fixture
def json_web() -> Iterator[FixtureServer]:
    # Plain JSON answers: uvicorn finishes them on SIGTERM (SSE answers would end at once), like a production
    # server stopped with a call in flight.
    server = FixtureServer("tests.fixtures.basic_server", "--json-response")
    yield server
    if server.proc.poll() is None:
        server.stop()


async def test_an_http_upstream_stopped_with_a_call_in_flight_stays_down_and_its_calls_fail_fast(
        tmp_path: Path, json_web: FixtureServer) -> None:
    # The hostile-client review's case: SIGTERM while a 3 s call is in flight. uvicorn refuses new connections,
    # finishes that call, then exits; a call made meanwhile fails and the upstream is declared down; then the
    # in-flight call's answer arrives. That late answer must not bring the upstream back up (whose refresh would
    # fail and close its refresh gate): calls must keep failing fast with -31002, never wait out
    # catalogue.gate_timeout for -31010.
    gw = GatewayProcess({"auth": "none", "health": HEALTH,
                         "upstreams": {"slow": {"url": json_web.url, "era": "legacy", "timeout": "10s"}}},
                        tmp_path).start()
    try:
        async with Client(gw.url, mode="legacy") as client:
            assert "slow__slow" in {t.name for t in (await client.list_tools()).tools}
            in_flight: dict[str, Any] = {}

            async def long_call() -> None:
                try:
                    result = await client.call_tool("slow__slow", {"seconds": 3})
                    in_flight["text"] = result.content[0].text
                except Exception as exc:  # what happened is what the assertion below reports
                    in_flight["error"] = repr(exc)

            published_before = gw.stderr().count("catalogue.published")
            ups = transitions(metrics(gw), "slow", "up")
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(long_call)
                await anyio.sleep(0.8)  # the call has reached the upstream
                json_web.proc.send_signal(signal.SIGTERM)
                await anyio.sleep(0.3)  # uvicorn stops listening
                with pytest.raises(Exception) as failure:
                    await client.call_tool("slow__echo", {"message": "during shutdown"})
                assert getattr(getattr(failure.value, "error", None), "code", None) == -31002, repr(failure.value)
                await anyio.to_thread.run_sync(
                    lambda: wait_until(lambda: state(gw, "slow") == "down", 10, "slow never reported down"))
            # The in-flight call's answer arrived after the upstream was declared down.
            assert in_flight.get("text") == "done", in_flight
            await anyio.to_thread.run_sync(lambda: json_web.proc.wait(timeout=10))
            # From now on, for as long as it stays down (observed: 35 s and more), every call fails fast.
            deadline = time.monotonic() + 4.0  # past hide_after and two gate timeouts
            calls = 0
            while time.monotonic() < deadline:
                started = time.monotonic()
                with pytest.raises(Exception) as failure:
                    await client.call_tool("slow__echo", {"message": "x"})
                took = time.monotonic() - started
                code = getattr(getattr(failure.value, "error", None), "code", None)
                assert code == -31002, f"call {calls}: {failure.value!r} after {took:.2f}s"
                assert took < 1.0, f"call {calls} took {took:.2f}s"
                calls += 1
                await anyio.sleep(0.25)
            health = readyz(gw)[1]["checks"]["upstream_health"]["slow"]
            assert (health["state"], health["tools_hidden"]) == ("down", True)
            assert transitions(metrics(gw), "slow", "up") == ups  # never reported up while it was gone
        records = [r for r in gw.records("tool.call") if r["tool"]["name"] == "slow__echo"]
        assert records and all(r["outcome"] == "upstream_unavailable" for r in records)
        assert not any(r["stage"] == "refresh_gate" for r in records)
        # Hiding its tools is one publish; a failing refresh would republish every ~1.2 s.
        assert gw.stderr().count("catalogue.published") - published_before <= 2
    finally:
        gw.stop()
