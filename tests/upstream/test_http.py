"""Streamable HTTP and legacy SSE specifics: sessions, re-initialization, headers, origin checks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from bastion.errors import UpstreamUnavailable
from bastion.upstream.http import HttpUpstream
from bastion.upstream.http_sse import SseUpstream
from tests.upstream.helpers import HttpServer, Inbox


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer("streamable-http", tmp_path / "calls.jsonl").start()
    yield server
    server.stop()


async def test_configured_headers_session_and_version_reach_the_server(http_server: HttpServer) -> None:
    async with httpx.AsyncClient() as client:
        up = HttpUpstream("basic", http_server.base + "/mcp", {"Authorization": "Bearer upstream-secret"}, client)
        await up.start(Inbox())
        try:
            result = await up.request("tools/call", {"name": "whoami", "arguments": {}}, timeout=10)
        finally:
            await up.close()
    headers = result["structuredContent"]
    assert headers["authorization"] == "Bearer upstream-secret"
    assert headers["mcp-protocol-version"] == "2025-11-25"
    assert headers["mcp-session-id"]
    assert "text/event-stream" in headers["accept"]


async def test_server_restart_means_reinitialize_and_retry(http_server: HttpServer) -> None:
    inbox = Inbox()
    async with httpx.AsyncClient() as client:
        up = HttpUpstream("basic", http_server.base + "/mcp", {}, client)
        await up.start(inbox)
        try:
            before = (await up.request("tools/call", {"name": "whoami", "arguments": {}}, timeout=10))
            http_server.restart()
            result = await up.request("tools/call", {"name": "echo", "arguments": {"message": "again"}}, timeout=20)
            assert result["content"][0]["text"] == "again"
            after = (await up.request("tools/call", {"name": "whoami", "arguments": {}}, timeout=10))
            assert after["structuredContent"]["mcp-session-id"] != before["structuredContent"]["mcp-session-id"]
            await inbox.wait_for("notifications/tools/list_changed")
        finally:
            await up.close()


async def test_unreachable_server_is_unavailable() -> None:
    from tests.support.net import free_port

    async with httpx.AsyncClient() as client:
        up = HttpUpstream("gone", f"http://127.0.0.1:{free_port()}/mcp", {}, client)
        with pytest.raises(UpstreamUnavailable) as info:
            await up.start(Inbox())
        assert "127.0.0.1" not in info.value.message
        assert "ConnectError" in (info.value.log_detail or "")
        await up.close()


async def test_close_deletes_the_session(tmp_path: Path) -> None:
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.headers.get("mcp-session-id")))
        if request.method == "GET":
            return httpx.Response(405)
        if request.method == "DELETE":
            return httpx.Response(200)
        body = json.loads(request.content)
        if "id" not in body:
            return httpx.Response(202)
        result = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "s", "version": "0"}}
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": result},
                              headers={"Mcp-Session-Id": "abc"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        up = HttpUpstream("scripted", "http://upstream.test/mcp", {}, client)
        info = await up.start(Inbox())
        assert info.protocol_version == "2025-06-18"
        async with asyncio.timeout(5):
            while ("GET", "abc") not in seen:
                await asyncio.sleep(0.01)
        await up.close()
    assert seen[0] == ("POST", None)
    assert ("POST", "abc") in seen  # notifications/initialized carries the session
    assert seen[-1] == ("DELETE", "abc")


async def test_legacy_sse_refuses_a_cross_origin_endpoint() -> None:
    posts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            posts.append(str(request.url))
            return httpx.Response(202)
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=b"event: endpoint\ndata: http://169.254.169.254/latest\n\n")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        up = SseUpstream("legacy", "http://upstream.test/sse", {"Authorization": "Bearer x"}, client)
        with pytest.raises(UpstreamUnavailable) as info:
            await up.start(Inbox())
        await up.close()
    assert "not same-origin" in (info.value.log_detail or "")
    assert posts == []


async def test_legacy_sse_accepts_a_relative_endpoint() -> None:
    posts: list[str] = []
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    queue.put_nowait(b"event: endpoint\ndata: /messages/?session_id=1\n\n")

    class Events(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            while True:
                yield await queue.get()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            posts.append(str(request.url))
            body = json.loads(request.content)
            if "id" in body:
                result = {"protocolVersion": "2024-11-05", "capabilities": {},
                          "serverInfo": {"name": "s", "version": "0"}}
                answer = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result})
                queue.put_nowait(b"event: message\ndata: " + answer.encode() + b"\n\n")
            return httpx.Response(202)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Events())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        up = SseUpstream("legacy", "http://upstream.test/sse", {}, client)
        info = await up.start(Inbox())
        await up.close()
    assert info.protocol_version == "2024-11-05"
    assert posts[0] == "http://upstream.test/messages/?session_id=1"
