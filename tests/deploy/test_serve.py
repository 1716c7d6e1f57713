"""The container's exact command, run outside a container against the compose config.

The compose config is copied with its three container-only references mapped to this machine (the demo scripts'
path in the image, the policies mount, the ``tools`` service's DNS name); everything else is the file as shipped.
Host, port and Redis come from the environment variables an operator would set.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.deploy.support import ROOT, dockerfile
from tests.support.net import free_port, wait_for_port
from tests.support.redis_server import RedisServer

DEMO = ROOT / "examples" / "demo"
DEMO_KEY = "bst_demo-compose-only-DO-NOT-DEPLOY"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "deploy-test", "version": "1"}}}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def container_command(config: Path) -> list[str]:
    """ENTRYPOINT + CMD from the Dockerfile's final stage, with the mounted config path swapped for ``config``."""
    final = [i for i in dockerfile() if i.stage == max(j.stage for j in dockerfile())]
    entry = next(i for i in final if i.keyword == "ENTRYPOINT").exec_form()
    cmd = next(i for i in final if i.keyword == "CMD").exec_form()
    argv = entry + cmd
    argv[argv.index("/etc/bastion/bastion.yaml")] = str(config)
    # The image puts the venv's bin first on PATH; here that is the venv running the tests.
    argv[argv.index("bastion")] = str(Path(sys.executable).with_name("bastion"))
    # The image's tini is Debian's static build; here Debian's tini package (.ci/test installs it).
    tini = shutil.which("tini")
    assert tini, "tini is missing: install Debian's 'tini' package (.ci/test does)"
    argv[argv.index("/usr/bin/tini")] = tini
    return argv


def localize(tmp: Path, tools_port: int) -> Path:
    text = (ROOT / "deploy" / "compose" / "bastion.yaml").read_text()
    for container, here in (("/opt/bastion/examples/demo", str(DEMO)),
                            ("/etc/bastion/policies", str(DEMO / "policies")),
                            ("http://tools:8091/mcp", f"http://127.0.0.1:{tools_port}/mcp")):
        assert container in text, f"deploy/compose/bastion.yaml no longer mentions {container}"
        text = text.replace(container, here)
    config = tmp / "bastion.yaml"
    config.write_text(text)
    return config


def session_members(sid: int) -> list[int]:
    """Every live process of session ``sid`` (the Linux /proc view), whatever process group it moved to."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[3]) == sid:
            found.append(int(stat.parent.name))
    return found


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop what the test started, whole. The gateway runs under an init (tini) that forwards SIGTERM, so a
    graceful stop reaches bastion and its stdio upstreams; whatever is left of the session afterwards (bastion
    moves to a process group of its own, so the init's group is not enough) is killed."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    for pid in session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    port: int
    stderr: Path
    env: dict[str, str]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_events(self) -> list[dict[str, object]]:
        events = []
        for line in self.stderr.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events


@pytest.fixture
def tools_upstream() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(DEMO / "tools_server.py"), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_port(port, timeout=60)
        yield port
    finally:
        stop(proc)


@pytest.fixture
def gateway(tmp_path: Path, tools_upstream: int, redis_server: RedisServer) -> Iterator[Gateway]:
    port = free_port()
    env = {**os.environ, "BASTION_HOST": "127.0.0.1", "BASTION_PORT": str(port),
           "BASTION_REDIS_URL": redis_server.url, "BASTION_LOG_FORMAT": "json", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("BASTION_CONFIG", None)
    stderr = tmp_path / "stderr.log"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(container_command(localize(tmp_path, tools_upstream)), env=env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    gw = Gateway(proc, port, stderr, env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, "bastion exited during start-up:\n" + stderr.read_text()[-3000:]
            try:
                if httpx.get(f"{gw.base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield gw
    finally:
        stop(proc)


def children_of(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        kids.extend(int(k) for k in text)
    return kids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_health_readiness_and_auth(gateway: Gateway) -> None:
    assert httpx.get(f"{gateway.base}/healthz", timeout=10).json() == {"status": "ok"}
    ready = httpx.get(f"{gateway.base}/readyz", timeout=10)
    assert ready.status_code == 200
    checks = ready.json()["checks"]
    assert checks["upstreams"] == {"notes": True, "tools": True}
    assert checks["redis"] is True

    # The image's HEALTHCHECK command, pointed at this process by the same variable the image sets.
    probe = subprocess.run([sys.executable, str(ROOT / "deploy" / "docker" / "healthcheck.py")],
                           env={**gateway.env}, capture_output=True, timeout=30)
    assert probe.returncode == 0, probe.stderr

    anonymous = httpx.post(f"{gateway.base}/mcp", json=INIT, headers=HEADERS, timeout=10)
    assert anonymous.status_code == 401
    ok = httpx.post(f"{gateway.base}/mcp", json=INIT, timeout=10,
                    headers={**HEADERS, "authorization": f"Bearer {DEMO_KEY}"})
    assert ok.status_code == 200
    assert ok.headers["mcp-session-id"]
    assert ok.json()["result"]["serverInfo"]["name"] == "bastion"


def test_healthcheck_fails_when_nothing_listens() -> None:
    probe = subprocess.run([sys.executable, str(ROOT / "deploy" / "docker" / "healthcheck.py")],
                           env={**os.environ, "BASTION_PORT": str(free_port())}, capture_output=True, timeout=30)
    assert probe.returncode == 1
    assert b"unhealthy" in probe.stderr


def test_sigterm_shuts_down_cleanly(gateway: Gateway) -> None:
    # The signal goes to the init (PID 1 in the image), which forwards it to bastion alone; bastion then closes
    # its stdio upstreams in its own order.
    (bastion,) = children_of(gateway.proc.pid)
    stdio_children = children_of(bastion)
    assert stdio_children, "the stdio demo upstream should be running as bastion's child"
    gateway.proc.send_signal(signal.SIGTERM)
    # The image's default --grace is 30 s; a generous bound on top, since the test only fails on a hang.
    code = gateway.proc.wait(timeout=90)
    assert code == 0, gateway.stderr.read_text()[-3000:]
    events = [str(e.get("event")) for e in gateway.log_events()]
    assert "Application shutdown complete." in events, events[-10:]
    for pid in [bastion, *stdio_children]:
        deadline = time.monotonic() + 30
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), f"stdio upstream {pid} outlived bastion"
