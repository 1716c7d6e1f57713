"""A real gateway in front of hostile HTTP upstreams: raw asyncio servers (on a thread of their own) that send
what no HTTP library would, next to well-behaved ones.

- A response head of 20,000 repeated lines fails that call (-31002) and nothing else: the same upstream's next
  call, and other upstreams, are served.
- A cookie one upstream sets is never sent anywhere: not to another upstream on the same host (cookies ignore
  ports), not back to the upstream that set it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.raw_http import read_request
from tests.support.rpc import RpcClient

TOOLS = [{"name": "echo", "inputSchema": {"type": "object"}}, {"name": "pad", "inputSchema": {"type": "object"}}]
PAD = b"X-Pad: " + b"a" * 100 + b"\r\n"


@dataclass
class RawMcp:
    """A Streamable HTTP MCP server (handshake era) on its own thread and loop. ``cookie``: a Set-Cookie header
    on every answer, the GET stream's included (which it then keeps open). ``pad``: the tool answers with 20,000
    copies of one header line before a valid body. ``seen``: the Cookie header of every request it received."""

    cookie: bytes | None = None
    seen: list[tuple[str, str | None]] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stopping: asyncio.Future[None] = field(init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> RawMcp:
        started = threading.Event()

        async def main() -> None:
            self._stopping = asyncio.get_running_loop().create_future()
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            async with server:
                await self._stopping
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(main(),), daemon=True)
        self._thread.start()
        assert started.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._stopping.set_result, None)
        self._thread.join(10)
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                method, _, headers, body = await read_request(reader)
                self.seen.append((method, headers.get("cookie")))
                extra = b"Set-Cookie: upstream_session=SECRET; Path=/\r\n" if self.cookie else b""
                if method == "GET":
                    if not self.cookie:
                        writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                        await writer.drain()
                        continue
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n%s"
                                 b"Transfer-Encoding: chunked\r\n\r\n" % extra)
                    await writer.drain()
                    await reader.read()  # the stream stays open until the gateway leaves
                    return
                if method == "DELETE":
                    writer.write(b"HTTP/1.1 200 OK\r\n%sContent-Length: 0\r\n\r\n" % extra)
                    await writer.drain()
                    continue
                message = orjson.loads(body)
                if "id" not in message:
                    writer.write(b"HTTP/1.1 202 Accepted\r\n%sContent-Length: 0\r\n\r\n" % extra)
                    await writer.drain()
                    continue
                answer = orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": self._result(message)})
                pad = PAD * 20_000 if message["method"] == "tools/call" and \
                    message["params"]["name"] == "pad" else b""
                if message["method"] == "initialize":
                    pad = b"Mcp-Session-Id: s1\r\n"  # so that the gateway ends the session with DELETE
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%s%sContent-Length: %d\r\n\r\n%s"
                             % (extra, pad, len(answer), answer))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _result(message: dict[str, Any]) -> dict[str, Any]:
        name = message["method"]
        if name == "initialize":
            return {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "raw", "version": "1"}}
        if name == "tools/list":
            return {"tools": TOOLS}
        if name == "tools/call":
            return {"content": [{"type": "text", "text": "ok"}]}
        return {}


@pytest.fixture
def servers() -> Iterator[list[RawMcp]]:
    started: list[RawMcp] = []
    yield started
    for server in started:
        server.stop()


def test_a_huge_response_head_fails_that_call_only(tmp_path: Path, servers: list[RawMcp]) -> None:
    evil = RawMcp().start()
    servers.append(evil)
    gw = GatewayProcess({"auth": "none", "pinning": {"enabled": False}, "upstreams": {
        "evil": {"url": evil.url, "era": "legacy"},
        "good": stdio_upstream()}}, tmp_path).start()
    client = RpcClient(gw.url)
    try:
        client.initialize()
        refused = client.call("evil__pad")
        assert refused["error"]["code"] == -31002, refused
        assert client.call("evil__echo")["result"]["content"][0]["text"] == "ok"
        assert "result" in client.call("good__echo", {"message": "hi"})
    finally:
        client.close()
        gw.stop()
    assert "over 100 header lines" in gw.stderr()


@pytest.mark.parametrize("client_kind", ["fast", "httpx"])
def test_cookies_set_by_an_upstream_are_never_sent(tmp_path: Path, servers: list[RawMcp], client_kind: str) -> None:
    legit = RawMcp(cookie=b"upstream_session=SECRET").start()
    evil = RawMcp().start()
    servers.extend((legit, evil))
    # Same host, other ports. Under httpx every request of both goes through the shared client; under the lean
    # pool their GET streams and DELETEs still do.
    gw = GatewayProcess({"auth": "none", "pinning": {"enabled": False}, "upstreams": {
        "legit": {"url": legit.url, "era": "legacy", "http_client": client_kind},
        "evil": {"url": evil.url, "era": "legacy", "http_client": client_kind}}}, tmp_path).start()
    client = RpcClient(gw.url)
    try:
        client.initialize()
        # legit's GET stream answered (start waits for it) and its answers set the cookie; now evil is asked.
        assert client.call("legit__echo")["result"]["content"][0]["text"] == "ok"
        assert client.call("evil__echo")["result"]["content"][0]["text"] == "ok"
        assert client.call("legit__echo")["result"]["content"][0]["text"] == "ok"
    finally:
        client.close()
        gw.stop()  # ends both sessions with DELETE
    assert ("DELETE", None) in evil.seen and ("DELETE", None) in legit.seen
    assert [s for s in evil.seen if s[1] is not None] == []
    assert [s for s in legit.seen if s[1] is not None] == []
