"""Every transport is restartable: ``close`` then ``start`` behaves like a fresh start.

The pool keeps one upstream object per configured upstream for the gateway's lifetime (the view publisher, the
health wiring and the admin pages all hold it), and after a failed connect it closes the half-started object and
calls ``start`` on the same object again later. So a transport must come back from ``close``: an upstream that was
unreachable at start-up, or failed its handshake, connects once it answers.

The test runs over every class in ``bastion.upstream`` that implements ``Upstream`` (``test_every_transport_is_
covered`` fails when one is added without a case here), in each of the ways ``build_upstream`` wires it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import pkgutil
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import bastion.upstream
from bastion.errors import UpstreamUnavailable
from bastion.upstream.base import EraSetting, Upstream
from bastion.upstream.config import UpstreamConfig, build_upstream
from bastion.upstream.connections import H1Pool
from bastion.upstream.http import HttpUpstream
from bastion.upstream.http_auto import AutoHttpUpstream
from bastion.upstream.http_modern import ModernHttpUpstream
from bastion.upstream.http_sse import SseUpstream
from bastion.upstream.stdio import StdioUpstream
from tests.upstream.helpers import ROOT, HttpServer, Inbox

BASIC = "tests.fixtures.basic_server"
MODERN = "tests.fixtures.modern_server"


@dataclass(frozen=True)
class Case:
    """One way to build a transport: its class, the fixture server it talks to, and how it is built."""

    cls: type[Any]
    module: str
    transport: str  # the fixture's --transport: stdio, streamable-http or sse
    build: Callable[[str, httpx.AsyncClient, H1Pool], Upstream]  # (url or gate file, client, lean pool)


def _stdio(era: EraSetting, module: str) -> Callable[[str, httpx.AsyncClient, H1Pool], Upstream]:
    def build(gate: str, client: httpx.AsyncClient, fast: H1Pool) -> Upstream:
        # The child exits at once until the gate file exists: a server that cannot start yet.
        command = ["/bin/sh", "-c", f'[ -e "{gate}" ] || exit 3; exec "{sys.executable}" -m {module} '
                   "--transport stdio"]
        return StdioUpstream("late", command, cwd=str(ROOT), era=era)
    return build


CASES: dict[str, Case] = {
    "stdio-legacy": Case(StdioUpstream, BASIC, "stdio", _stdio("legacy", BASIC)),
    "stdio-modern": Case(StdioUpstream, MODERN, "stdio", _stdio("modern", MODERN)),
    "sse": Case(SseUpstream, BASIC, "sse", lambda url, client, fast: SseUpstream("late", url + "/sse", {}, client)),
    "http-legacy": Case(HttpUpstream, BASIC, "streamable-http",
                        lambda url, client, fast: HttpUpstream("late", url + "/mcp", {}, client)),
    "http-legacy-fast": Case(HttpUpstream, BASIC, "streamable-http",
                             lambda url, client, fast: HttpUpstream("late", url + "/mcp", {}, client, fast=fast)),
    "http-modern": Case(ModernHttpUpstream, MODERN, "streamable-http",
                        lambda url, client, fast: ModernHttpUpstream("late", url + "/mcp", {}, client)),
    "http-modern-fast": Case(ModernHttpUpstream, MODERN, "streamable-http",
                             lambda url, client, fast: ModernHttpUpstream("late", url + "/mcp", {}, client, fast=fast)),
    # As the gateway builds them from configuration, with the lean pool owned by the upstream. The basic fixture
    # answers server/discover but speaks the handshake era's shapes, so it needs the era pinned (docs/upstreams.md).
    "auto-fast": Case(AutoHttpUpstream, BASIC, "streamable-http", lambda url, client, fast: build_upstream(
        UpstreamConfig.from_mapping("late", {"url": url + "/mcp", "era": "legacy"}), client)),
    "auto-httpx": Case(AutoHttpUpstream, BASIC, "streamable-http", lambda url, client, fast: build_upstream(
        UpstreamConfig.from_mapping("late", {"url": url + "/mcp", "era": "legacy", "http_client": "httpx"}),
        client)),
    "auto-fast-modern": Case(AutoHttpUpstream, MODERN, "streamable-http", lambda url, client, fast: build_upstream(
        UpstreamConfig.from_mapping("late", {"url": url + "/mcp"}), client)),
}


def _transport_classes() -> set[type[Any]]:
    """Every concrete class in ``bastion.upstream`` with the ``Upstream`` protocol's methods."""
    found: set[type[Any]] = set()
    for module_info in pkgutil.iter_modules(bastion.upstream.__path__):
        module = importlib.import_module(f"bastion.upstream.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or getattr(cls, "_is_protocol", False):
                continue
            if all(callable(getattr(cls, m, None)) for m in ("start", "request", "notify", "close")):
                found.add(cls)
    return found


def test_every_transport_is_covered() -> None:
    transports = _transport_classes()
    assert StdioUpstream in transports and AutoHttpUpstream in transports  # the discovery itself works
    assert transports == {case.cls for case in CASES.values()}


class Server:
    """The fixture server behind one case, which can be down: a port nobody listens on, or a gate file missing."""

    def __init__(self, case: Case, tmp_path: Path) -> None:
        self.case = case
        self.gate = tmp_path / "gate"
        self.http = None if case.transport == "stdio" else HttpServer(case.transport, tmp_path / "calls.jsonl",
                                                                      module=case.module)

    @property
    def address(self) -> str:
        return str(self.gate) if self.http is None else self.http.base

    def up(self) -> None:
        if self.http is None:
            self.gate.touch()
        else:
            self.http.start()

    def down(self) -> None:
        if self.http is None:
            self.gate.unlink(missing_ok=True)
        else:
            self.http.stop()


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[str(request.param)]


@pytest.fixture
async def server(case: Case, tmp_path: Path) -> AsyncIterator[Server]:
    server = Server(case, tmp_path)
    try:
        yield server
    finally:
        server.down()


async def _tools(up: Upstream) -> list[str]:
    result = await up.request("tools/list", None, timeout=10)
    return [tool["name"] for tool in result["tools"]]


async def test_close_then_start_is_a_fresh_start(case: Case, server: Server) -> None:
    fast = H1Pool("late")
    async with httpx.AsyncClient() as client:
        up = case.build(server.address, client, fast)
        try:
            # Down: the start fails, and the pool closes the half-started upstream (``UpstreamPool._connect``);
            # its next attempt fails the same way, as promptly (not after the 30 s initialize timeout).
            for _ in range(2):
                with pytest.raises(UpstreamUnavailable):
                    async with asyncio.timeout(20):
                        await up.start(Inbox())
                await up.close()

            server.up()
            async with asyncio.timeout(30):
                info = await up.start(Inbox())
            assert up.info == info
            assert "echo" in await _tools(up)

            # A connected upstream closed and started again is a fresh start too.
            await up.close()
            async with asyncio.timeout(30):
                await up.start(Inbox())
            assert "echo" in await _tools(up)
        finally:
            await up.close()
            await fast.aclose()


async def test_a_restarted_upstream_still_recovers_from_losing_its_server(case: Case, server: Server) -> None:
    """After failed start, close and start, the transport's own recovery still works: a stdio child that dies is
    restarted, an SSE stream that ends is re-opened, an HTTP session the server forgot is initialized again."""
    fast = H1Pool("late")
    async with httpx.AsyncClient() as client:
        up = case.build(server.address, client, fast)
        try:
            with pytest.raises(UpstreamUnavailable):
                async with asyncio.timeout(30):
                    await up.start(Inbox())
            await up.close()
            server.up()
            async with asyncio.timeout(30):
                await up.start(Inbox())
            assert "echo" in await _tools(up)

            if server.http is None:
                pid = getattr(up, "pid", None)
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
            else:
                server.http.restart()
            async with asyncio.timeout(30):
                while True:
                    try:
                        assert "echo" in await _tools(up)
                        break
                    except UpstreamUnavailable:
                        await asyncio.sleep(0.1)
        finally:
            await up.close()
            await fast.aclose()
