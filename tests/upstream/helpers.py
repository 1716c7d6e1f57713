"""Helpers for the upstream tests: a message recorder and the fixture server as a real subprocess."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from tests.support.net import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
# The event loops bastion runs on: asyncio's own (tests, embedding) and uvloop (``bastion serve``).
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop,
                                                             "uvloop": uvloop.new_event_loop}


def run_on(loop: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on a new event loop of the kind named (a sync test parametrized over ``LOOPS``)."""
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(main())


def server_command(*args: str, module: str = "tests.fixtures.basic_server") -> list[str]:
    return [sys.executable, "-m", module, *args]


def modern_command(*args: str) -> list[str]:
    return server_command(*args, module="tests.fixtures.modern_server")


class Inbox:
    """Collects (method, params) pairs; ``wait_for`` blocks until one with the given method arrives."""

    def __init__(self, answers: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._answers = dict(answers or {})
        self._changed = asyncio.Event()

    async def __call__(self, method: str, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        self.messages.append((method, dict(params)))
        self._changed.set()
        return self._answers.get(method)

    def of(self, method: str) -> list[dict[str, Any]]:
        return [p for m, p in self.messages if m == method]

    async def wait_for(self, method: str, count: int = 1, timeout: float = 15.0) -> list[dict[str, Any]]:
        async with asyncio.timeout(timeout):
            while len(self.of(method)) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.of(method)


SAMPLING_ANSWER = {"role": "assistant", "content": {"type": "text", "text": "forty-two"}, "model": "test-model"}


@dataclass
class HttpServer:
    transport: str
    record: Path
    extra: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    module: str = "tests.fixtures.basic_server"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HttpServer:
        cmd = server_command("--transport", self.transport, "--port", str(self.port), "--record", str(self.record),
                             *self.extra, module=self.module)
        self.proc = subprocess.Popen(cmd, cwd=ROOT)
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()
