"""Start and stop are clean for operators: a port in use fails before anything starts; the demo stops whole."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from tests.faults.procs import descendants, wait_gone
from tests.support.gateway import REPO
from tests.support.net import free_port


def test_a_port_in_use_fails_before_any_upstream_starts_or_ready_is_logged(tmp_path: Path) -> None:
    marker = tmp_path / "upstream-started"
    config = tmp_path / "bastion.yaml"
    # The upstream would leave a marker file the moment it were spawned.
    config.write_text(yaml.safe_dump({
        "auth": "none",
        "upstreams": {"basic": {"command": ["/bin/sh", "-c", f'touch "{marker}"; exec "{sys.executable}" -m '
                                            "tests.fixtures.basic_server --transport stdio"],
                                "cwd": str(REPO), "era": "legacy"}},
    }))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "bastion", "serve", "--config", str(config), "--port", str(port)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "BASTION_LOG_FORMAT": "json"},
            capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "in use" in proc.stderr
    assert "bastion.ready" not in proc.stderr and "upstream.spawned" not in proc.stderr
    assert not marker.exists()


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_demo_stops_with_all_its_children_on_sigterm_to_its_own_pid() -> None:
    port, tools_port = free_port(), free_port()
    demo = subprocess.Popen(["bash", str(REPO / ".ci/demo"), "--port", str(port)], cwd=REPO,
                            env={**os.environ, "DEMO_TOOLS_PORT": str(tools_port), "BASTION_LOG_FORMAT": "json"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while not _ready(port):
            assert demo.poll() is None, demo.stderr.read().decode() if demo.stderr else ""
            assert time.monotonic() < deadline, "demo never became ready"
            time.sleep(0.1)
        children = descendants(demo.pid)
        assert len(children) >= 3, children  # the HTTP demo upstream, bastion, bastion's stdio upstream
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=30) == 143
        assert wait_gone(children, 10) == []
        assert (REPO / "var" / "demo-tools.log").exists()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        for pid in wait_gone(children, 0):  # whatever the demo left behind must not outlive the test
            os.kill(pid, signal.SIGKILL)


def test_sigterm_while_the_start_waits_on_an_upstream_stops_without_waiting_it_out(tmp_path: Path) -> None:
    # An upstream that never answers its initialize: uvicorn only read its stop flag once the lifespan's start-up
    # returned, so a SIGTERM waited the handshake's timeout out (30 s), logged bastion.ready, then stopped.
    config = tmp_path / "bastion.yaml"
    port = free_port()
    config.write_text(yaml.safe_dump({
        "auth": "none", "listen": {"host": "127.0.0.1", "port": port},
        "upstreams": {"mute": {"command": ["/bin/sleep", "3600"], "era": "legacy", "timeout": "3600s",
                               "max_timeout": "3600s"}},
    }))
    stderr = tmp_path / "stderr"
    proc = subprocess.Popen([sys.executable, "-m", "bastion", "serve", "--config", str(config)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src"), "BASTION_LOG_FORMAT": "json"},
                            stdout=subprocess.DEVNULL, stderr=stderr.open("wb"))
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while "upstream.spawned" not in stderr.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, stderr.read_text()
            time.sleep(0.1)
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        logs = stderr.read_text()
        assert "bastion.ready" not in logs
        assert "bastion.stopped_during_start" in logs
        assert wait_gone(children, 10) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in wait_gone(children, 0):
            os.kill(pid, signal.SIGKILL)
