"""A real redis-server process of the tests' own, on a free loopback port.

Tests never depend on a Redis that happens to run on the machine: each suite starts its own (and tests that kill
Redis start a private one), so they pass the same on a machine with none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.net import free_port, wait_for_port


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found; the test script installs it (apt-get install redis-server)")
        self.exe = exe
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bastion-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir), "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)
        return self

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Redis stopped (SIGSTOP) inside the block: connections stay open and nothing is answered, as with a
        server stuck on a slow disk or in a long command. It runs again however the block is left."""
        assert self.proc is not None, "the server is not running"
        pid = self.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
