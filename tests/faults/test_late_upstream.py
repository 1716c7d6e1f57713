"""An upstream that is not there when the gateway starts connects once it is.

The gateway starts with a Streamable HTTP upstream whose port nobody listens on (or whose server fails the
handshake); a few seconds later the real fixture server comes up on that port. The pool's connect retry must then
connect it: its tools become callable and ``/readyz`` reports it up. Meanwhile the log gives the real reason it is
down at every retry, not an artefact of the previous attempt (``client closed``, ``not connected``). A stdio
upstream connected that way must still be restarted when its child dies.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.procs import cmdline, descendants
from tests.support.gateway import REPO, GatewayProcess
from tests.support.net import free_port
from tests.support.rpc import RpcClient
from tests.upstream.helpers import HttpServer


class _WrongVersion(BaseHTTPRequestHandler):
    """A server that answers ``initialize`` with a protocol version nobody speaks (a broken build)."""

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        body = json.dumps({"jsonrpc": "2.0", "id": message.get("id"),
                           "result": {"protocolVersion": "1999-01-01", "capabilities": {"tools": {}},
                                      "serverInfo": {"name": "broken", "version": "0"}}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class BrokenServer:
    def __init__(self, port: int) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _WrongVersion)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


def readyz(gw: GatewayProcess) -> tuple[int, dict[str, Any]]:
    r = httpx.get(gw.base + "/readyz", timeout=5)
    return r.status_code, r.json()


def late_health(gw: GatewayProcess) -> dict[str, Any]:
    health: dict[str, Any] = readyz(gw)[1]["checks"]["upstream_health"]["late"]
    return health


def wait_until(what: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.05)
    raise AssertionError(f"{message} (after {timeout}s)")


def failed_attempts(gw: GatewayProcess) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in gw.stderr().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "upstream.unavailable" and line.get("upstream") == "late"]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def fixture_server(port: int, tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer("streamable-http", tmp_path / "calls.jsonl", port=port)
    yield server
    server.stop()


@pytest.mark.parametrize(("http_client", "first"), [("fast", "nothing"), ("httpx", "nothing"),
                                                    ("fast", "wrong-version")])
def test_an_http_upstream_that_comes_up_late_connects(tmp_path: Path, port: int, fixture_server: HttpServer,
                                                      http_client: str, first: str) -> None:
    broken = BrokenServer(port) if first == "wrong-version" else None
    gw = GatewayProcess({
        "auth": "none",
        "upstreams": {
            "late": {"url": f"http://127.0.0.1:{port}/mcp", "era": "legacy", "timeout": "5s",
                     "http_client": http_client},
        },
    }, tmp_path)
    try:
        gw.start(expect_ready=False)
        # Down, and not ready: it is the only upstream. The pool retries after 0.5 s, 1 s, 2 s, 4 s ...; at every
        # attempt the reason is that attempt's own failure.
        wait_until(lambda: len(failed_attempts(gw)) >= 2, 15, "the connect retry did not run")
        status, body = readyz(gw)
        assert status == 503
        health = body["checks"]["upstream_health"]["late"]
        assert health["state"] == "down"
        # /readyz answers anyone: its reason is bastion's own word; the attempt's own error is in the log.
        assert health["reason"] == "unavailable"
        expected = "connect" if broken is None else "version '1999-01-01'"
        for reason in (attempt["detail"] for attempt in failed_attempts(gw)):
            assert expected in reason and "closed" not in reason and "not connected" not in reason, reason

        if broken is not None:
            broken.stop()
        fixture_server.start()
        wait_until(lambda: late_health(gw)["state"] == "up", 30, "the late upstream never connected")
        assert readyz(gw)[0] == 200

        client = RpcClient(gw.url)
        try:
            client.initialize()
            wait_until(lambda: "late__echo" in client.tool_names(), 10, "its tools were never listed")
            answer = client.call("late__echo", {"message": "finally"})
            assert answer["result"]["content"][0]["text"] == "finally", answer
        finally:
            client.close()
    finally:
        gw.stop()
        if broken is not None:
            broken.stop()


def test_a_stdio_upstream_that_starts_late_is_restarted_after_a_crash(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    # The child exits at once until the gate file exists.
    command = ["/bin/sh", "-c", f'[ -e "{gate}" ] || exit 3; exec "{sys.executable}" -m '
               "tests.fixtures.basic_server --transport stdio"]
    gw = GatewayProcess({"auth": "none",
                         "upstreams": {"late": {"command": command, "cwd": str(REPO), "era": "legacy"}}}, tmp_path)
    try:
        gw.start(expect_ready=False)
        # Before the fix, the second attempt's child exited unnoticed (the first attempt's close had marked the
        # upstream as shutting down), so the attempt hung until the 30 s initialize timeout.
        wait_until(lambda: len(failed_attempts(gw)) >= 2, 15, "the connect retry did not fail promptly")
        assert late_health(gw)["state"] == "down"
        gate.touch()
        wait_until(lambda: late_health(gw)["state"] == "up", 30, "the late upstream never connected")

        gateway = gw.proc
        assert gateway is not None

        def children() -> list[int]:
            return [p for p in descendants(gateway.pid) if "basic_server" in cmdline(p)]

        first = children()
        assert len(first) == 1, first
        os.kill(first[0], signal.SIGKILL)
        # Before the fix, the retry's close had marked the upstream as shutting down for good: the dead child was
        # never replaced.
        wait_until(lambda: (now := children()) != [] and first[0] not in now and late_health(gw)["state"] == "up",
                   20, "the crashed child was never restarted")
        client = RpcClient(gw.url)
        try:
            client.initialize()
            answer = client.call("late__echo", {"message": "again"})
            assert answer["result"]["content"][0]["text"] == "again", answer
        finally:
            client.close()
    finally:
        gw.stop()
