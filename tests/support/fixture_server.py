"""A fixture MCP server (``tests/fixtures/*``) over Streamable HTTP on a free loopback port, as a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.gateway import REPO
from tests.support.net import free_port, wait_for_port


class FixtureServer:
    def __init__(self, module: str = "tests.fixtures.basic_server", *args: str, log: Path | None = None) -> None:
        self.port = free_port()
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--transport", "streamable-http", "--port", str(self.port), *args],
            cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=log.open("wb") if log is not None else subprocess.DEVNULL)
        wait_for_port(self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
