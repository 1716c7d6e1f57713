"""Run bastion for real: ``python -m bastion serve`` as a subprocess on a free loopback port.

The gateway's stdout carries the audit records (JSON lines) and its stderr the logs; both go to files the test
can read, so end-to-end tests assert on what an operator would see.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[2]


def _die_with_parent() -> None:
    """Linux: SIGTERM the gateway when the test process dies, so a killed test run leaves no orphan behind."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class GatewayProcess:
    def __init__(self, config: dict[str, Any], workdir: Path, *, env: dict[str, str] | None = None,
                 port: int | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.config = {**config, "listen": {"host": "127.0.0.1", "port": self.port,
                                            **config.get("listen", {})}}
        self.config_path = workdir / f"bastion-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.stdout_path = workdir / f"bastion-{self.port}.out"
        self.stderr_path = workdir / f"bastion-{self.port}.err"
        # The checkout's own src first: the installed (editable) bastion may be another checkout's.
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO / "src"), str(REPO))),
                    "BASTION_LOG_FORMAT": "json", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base + self.config.get("listen", {}).get("path", "/mcp")

    def start(self, *, timeout: float = 60.0, expect_ready: bool = True, stdout: int | None = None) -> GatewayProcess:
        """``stdout``: a descriptor for the gateway's stdout (the audit records) instead of ``stdout_path``."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bastion", "serve", "--config", str(self.config_path)],
            cwd=REPO, env=self.env, stdout=self.stdout_path.open("wb") if stdout is None else stdout,
            stderr=self.stderr_path.open("wb"), preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bastion exited with {self.proc.returncode}:\n{self.stderr()}")
            try:
                r = httpx.get(self.base + "/readyz", timeout=1.0)
                if r.status_code == 200 or (not expect_ready and r.status_code == 503):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"bastion not ready after {timeout}s:\n{self.stderr()}")

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        """Audit records written so far (stdout JSON lines)."""
        out = []
        if not self.stdout_path.exists():
            return out
        text = self.stdout_path.read_text()
        # Only complete lines: the gateway may be half-way through writing the last one.
        for line in text[: text.rfind("\n") + 1].split("\n"):  # not splitlines: U+2028 is not a line end here
            line = line.strip()
            if not line.startswith("{"):
                continue
            doc = json.loads(line)
            if event is None or doc.get("event") == event:
                out.append(doc)
        return out

    def wait_records(self, event: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.records(event)
            if len(found) >= count:
                return found
            time.sleep(0.05)
        return self.records(event)
