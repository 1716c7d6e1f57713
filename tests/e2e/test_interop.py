"""Interoperability with public peers: the reference server-everything (npm) behind bastion over all three
transports, and the 1.x line of the official Python SDK as a client."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client

from tests.support import peers
from tests.support.gateway import GatewayProcess
from tests.support.net import free_port, wait_for_port


@pytest.fixture(scope="module")
def everything_http() -> Iterator[dict[str, int]]:
    """server-everything's Streamable HTTP and SSE transports each on a free port of their own."""
    binary = peers.everything_bin()
    procs: list[subprocess.Popen[bytes]] = []
    ports: dict[str, int] = {}
    for transport in ("streamableHttp", "sse"):
        port = free_port()
        procs.append(subprocess.Popen([str(binary), transport], env={**os.environ, "PORT": str(port)},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for_port(port)
        ports[transport] = port
    yield ports
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def interop(tmp_path_factory: pytest.TempPathFactory, everything_http: dict[str, int]) -> Iterator[GatewayProcess]:
    binary = peers.everything_bin()
    gw = GatewayProcess({
        "auth": "none",
        "upstreams": {
            "evstdio": {"command": [str(binary), "stdio"]},
            "evhttp": {"url": f"http://127.0.0.1:{everything_http['streamableHttp']}/mcp"},
            "evsse": {"url": f"http://127.0.0.1:{everything_http['sse']}/sse", "transport": "sse"},
        },
    }, tmp_path_factory.mktemp("interop")).start()
    yield gw
    gw.stop()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_reference_server_over_every_transport(interop: GatewayProcess, mode: str) -> None:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with Client(interop.url, mode=mode) as client:  # type: ignore[arg-type]
        names = {t.name for t in (await client.list_tools()).tools}
        for prefix in ("evstdio", "evhttp", "evsse"):
            assert f"{prefix}__echo" in names
            echoed = await client.call_tool(f"{prefix}__echo", {"message": f"hi {prefix}"})
            assert f"hi {prefix}" in echoed.content[0].text
            summed = await client.call_tool(f"{prefix}__get-sum", {"a": 2, "b": 3})
            assert "5" in summed.content[0].text
        await client.call_tool("evstdio__trigger-long-running-operation", {"duration": 0.3, "steps": 3},
                               progress_callback=on_progress)
    assert progress == [1, 2, 3]


def test_the_1x_sdk_line_as_a_client(interop: GatewayProcess, tmp_path: Path) -> None:
    python = peers.mcp1_python()
    script = tmp_path / "client1x.py"
    script.write_text('''
import asyncio, json, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

async def main(url):
    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            result = await session.call_tool("evhttp__echo", {"message": "from 1.x"})
            print(json.dumps({"server": init.serverInfo.name, "version": init.protocolVersion,
                              "tools": [t.name for t in tools.tools], "text": result.content[0].text}))

asyncio.run(main(sys.argv[1]))
''')
    done = subprocess.run([str(python), str(script), interop.url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["server"] == "bastion"
    assert "evstdio__echo" in out["tools"]
    assert "from 1.x" in out["text"]
