"""The lean HTTP/1.1 keep-alive pool, against real loopback servers: scripted raw ones for the wire cases, the
benchmark's fast upstream and the SDK fixture servers for whole MCP exchanges."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest

from bastion.errors import UpstreamUnavailable
from bastion.sse import SseDecoder
from bastion.upstream.config import UpstreamConfig, build_upstream
from bastion.upstream.connections import H1Pool, Target, eligible
from bastion.upstream.http_auto import AutoHttpUpstream
from tests.support.net import free_port, wait_for_port
from tests.upstream.helpers import ROOT, HttpServer, Inbox

JSON = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@dataclass
class Request:
    head: bytes
    body: bytes

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode()
        return None


# Answers one request on one connection: (request, its index on this connection, connection index, writer).
# Returning False closes the connection.
Handler = Callable[[Request, int, int, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class RawServer:
    """A real HTTP/1.1 server on loopback whose answers a test scripts byte for byte."""

    handler: Handler
    connections: int = 0
    requests: list[Request] = field(default_factory=list)
    closed: int = 0
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/mcp"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        try:
            for n in range(1000):
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = Request(head, await reader.readexactly(length))
                self.requests.append(request)
                if not await self.handler(request, n, index, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Handler], Awaitable[RawServer]]]:
    started: list[asyncio.Server] = []

    async def start(handler: Handler) -> RawServer:
        server = RawServer(handler)
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0)
        started.append(server.server)
        return server

    yield start
    for server in started:
        server.close()


def ok(body: bytes, *, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body), extra, body)


async def echo_json(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
    writer.write(ok(request.body))
    return True


async def post(pool: H1Pool, url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with pool.post(Target.from_url(url), headers or JSON, body) as response:
        return response.status_code, await response.aread()


async def test_keep_alive_reuses_one_connection(raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    server = await raw(echo_json)
    pool = H1Pool("t")
    try:
        for i in range(5):
            assert await post(pool, server.url, b'{"n":%d}' % i) == (200, b'{"n":%d}' % i)
        assert server.connections == 1
        assert pool.idle_count() == 1
        first = server.requests[0]
        assert first.head.startswith(b"POST /mcp HTTP/1.1\r\n")
        assert first.header("host") == server.url.split("/")[2]
        assert first.header("content-type") == "application/json"
        assert first.header("content-length") == str(len(first.body))
    finally:
        await pool.aclose()
    assert pool.idle_count() == 0


async def test_chunked_body_split_across_writes(raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    async def chunked(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        for piece in (b'{"a":', b'"' + b"x" * 5000 + b'"', b"}"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        return True

    server = await raw(chunked)
    pool = H1Pool("t")
    try:
        for _ in range(2):
            status, body = await post(pool, server.url, b"{}")
            assert status == 200
            assert orjson.loads(body) == {"a": "x" * 5000}
        assert server.connections == 1  # a fully read chunked answer leaves the connection reusable
    finally:
        await pool.aclose()


async def test_body_until_close_is_read_and_not_reused(raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    async def until_close(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"done\":")
        await writer.drain()
        writer.write(b"true}")
        return False

    server = await raw(until_close)
    pool = H1Pool("t")
    try:
        assert await post(pool, server.url, b"{}") == (200, b'{"done":true}')
        assert await post(pool, server.url, b"{}") == (200, b'{"done":true}')
        assert server.connections == 2
        assert pool.idle_count() == 0
    finally:
        await pool.aclose()


async def test_connection_close_header_is_honoured(raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    async def closing(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(b"{}", extra=b"Connection: close\r\n"))
        return False

    server = await raw(closing)
    pool = H1Pool("t")
    try:
        for _ in range(3):
            assert await post(pool, server.url, b"{}") == (200, b"{}")
        assert server.connections == 3
    finally:
        await pool.aclose()


async def test_idle_connection_closed_by_the_server_is_not_reused(
        raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    async def once_per_connection(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(b"{}"))  # says keep-alive, then closes anyway: an idle timeout on the server
        return False

    server = await raw(once_per_connection)
    pool = H1Pool("t")
    try:
        assert await post(pool, server.url, b"{}") == (200, b"{}")
        async with asyncio.timeout(10):
            while server.closed < 1:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the FIN reaches our idle connection's protocol
        assert await post(pool, server.url, b"{}") == (200, b"{}")
        assert server.connections == 2
        assert len(server.requests) == 2
    finally:
        await pool.aclose()


async def test_reused_connection_dying_before_an_answer_is_retried_once(
        raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    async def second_request_dies(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        if n == 1:
            return False  # the keep-alive race: the server closes instead of answering
        writer.write(ok(request.body))
        return True

    server = await raw(second_request_dies)
    pool = H1Pool("t")
    try:
        assert await post(pool, server.url, b'{"n":1}') == (200, b'{"n":1}')
        assert await post(pool, server.url, b'{"n":2}') == (200, b'{"n":2}')
        assert server.connections == 2
        assert [r.body for r in server.requests] == [b'{"n":1}', b'{"n":2}', b'{"n":2}']
    finally:
        await pool.aclose()


async def test_new_connection_dying_before_an_answer_is_unavailable(
        raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    async def never(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        return False

    server = await raw(never)
    pool = H1Pool("t")
    try:
        with pytest.raises(UpstreamUnavailable) as caught:
            await post(pool, server.url, b"{}")
        assert caught.value.upstream == "t"
        assert "closed before an answer" in (caught.value.log_detail or "")
        assert server.connections == 1  # not retried: a fresh connection has no keep-alive race
    finally:
        await pool.aclose()


async def test_truncated_and_malformed_answers_are_unavailable(
        raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    async def truncated(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial")
        return False

    async def garbage(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SMTP ready\r\n\r\n")
        return True

    pool = H1Pool("t")
    try:
        for handler in (truncated, garbage):
            server = await raw(handler)
            with pytest.raises(UpstreamUnavailable):
                await post(pool, server.url, b"{}")
        assert pool.idle_count() == 0
    finally:
        await pool.aclose()


async def test_gzip_answers_are_decoded(raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    payload = orjson.dumps({"text": "y" * 20000})

    async def gzipped(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(gzip.compress(payload), extra=b"Content-Encoding: gzip\r\n"))
        return True

    server = await raw(gzipped)
    pool = H1Pool("t")
    try:
        assert await post(pool, server.url, b"{}") == (200, payload)
        assert server.requests[0].header("accept-encoding") == "gzip, deflate"
    finally:
        await pool.aclose()


async def test_large_answer_is_read_whole_and_connection_reused(
        raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    big = b'"' + b"z" * (3 * 1024 * 1024) + b'"'

    async def large(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(big))
        return True

    server = await raw(large)
    pool = H1Pool("t")
    try:
        for _ in range(2):
            assert await post(pool, server.url, b"{}") == (200, big)
        assert server.connections == 1
    finally:
        await pool.aclose()


async def test_concurrent_requests_each_get_their_own_answer(
        raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    async def slow_echo(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.01)
        writer.write(ok(request.body))
        return True

    server = await raw(slow_echo)
    pool = H1Pool("t", max_idle=8)
    try:
        for _ in range(3):
            answers = await asyncio.gather(*(post(pool, server.url, b'{"n":%d}' % i) for i in range(40)))
            assert answers == [(200, b'{"n":%d}' % i) for i in range(40)]
        assert pool.idle_count() <= 8
        assert server.connections <= 40 + 2 * (40 - 8)
    finally:
        await pool.aclose()


async def test_caller_deadline_closes_the_connection(raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    answered = asyncio.Event()

    async def stall_first(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        if conn == 0:
            await asyncio.sleep(30)
        writer.write(ok(b"{}"))
        answered.set()
        return True

    server = await raw(stall_first)
    pool = H1Pool("t")
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await post(pool, server.url, b"{}")
        assert pool.idle_count() == 0
        assert await post(pool, server.url, b"{}") == (200, b"{}")
        assert server.connections == 2
    finally:
        await pool.aclose()


async def test_unreachable_origin_is_unavailable() -> None:
    pool = H1Pool("gone", connect_timeout=5)
    try:
        with pytest.raises(UpstreamUnavailable) as caught:
            await post(pool, f"http://127.0.0.1:{free_port()}/mcp", b"{}")
        assert "connect" in (caught.value.log_detail or "")
        assert "127.0.0.1" not in caught.value.message
    finally:
        await pool.aclose()


async def test_header_injection_is_refused(raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    server = await raw(echo_json)
    pool = H1Pool("t")
    try:
        for bad in ({"X-Evil": "a\r\nInjected: yes"}, {"X-Evil\n": "a"}, {"X-Evil": "\u20ac"}):
            with pytest.raises(UpstreamUnavailable):
                await post(pool, server.url, b"{}", bad)
        assert server.requests == []
    finally:
        await pool.aclose()


async def test_sse_answer_streams_on_the_same_connection(raw: Callable[[Handler], Awaitable[RawServer]]) -> None:
    release = asyncio.Event()

    async def sse(request: Request, n: int, conn: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(3):
            event = b"event: message\r\ndata: {\"i\":%d}\r\n\r\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            if i == 1:
                await release.wait()
        writer.write(b"0\r\n\r\n")
        return True

    server = await raw(sse)
    pool = H1Pool("t")
    target = Target.from_url(server.url)
    try:
        seen: list[object] = []
        async with pool.post(target, JSON, b"{}") as response:
            assert response.headers["content-type"] == "text/event-stream"
            decoder = SseDecoder()
            async for chunk in response.aiter_bytes():
                for event in decoder.feed(chunk):
                    seen.append(orjson.loads(event.data))
                    if len(seen) == 2:
                        release.set()  # the third event only comes after the first two were read
        assert seen == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert pool.idle_count() == 1

        # Leaving early (the answer is in) closes the stream: that is how a streamed request is cancelled.
        release.clear()
        async with pool.post(target, JSON, b"{}") as response:
            async for _chunk in response.aiter_bytes():
                break
        assert pool.idle_count() == 0
        release.set()  # the server goes on writing, then finds the connection closed
        async with asyncio.timeout(10):
            while server.closed < 1:
                await asyncio.sleep(0.01)
    finally:
        await pool.aclose()


def test_targets_and_eligibility(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert Target.from_url("http://Example.test/mcp?x=1") == Target("http", "example.test", 80, "/mcp?x=1",
                                                                    "example.test")
    assert Target.from_url("https://[::1]:8443").host_header == "[::1]:8443"
    assert Target.parse("ftp://x/") is None
    assert eligible("http://127.0.0.1:9/mcp")
    assert not eligible("http://user:pw@127.0.0.1:9/mcp")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    assert not eligible("http://upstream.test/mcp")
    monkeypatch.setenv("NO_PROXY", "upstream.test")
    assert eligible("http://upstream.test/mcp")


def test_build_upstream_wires_the_pool_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "all_proxy", "HTTP_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    client = httpx.AsyncClient()
    fast = build_upstream(UpstreamConfig.from_mapping("a", {"url": "http://127.0.0.1:9/mcp"}), client)
    slow = build_upstream(UpstreamConfig.from_mapping("b", {"url": "http://127.0.0.1:9/mcp", "http_client": "httpx"}),
                          client)
    assert isinstance(fast, AutoHttpUpstream) and isinstance(slow, AutoHttpUpstream)
    assert fast._fast is not None
    assert slow._fast is None


# -- whole MCP exchanges -----------------------------------------------------------------------------------------


@pytest.fixture
def fast_upstream() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "upstream_fast.py"), "--port", str(port)], cwd=ROOT)
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_mcp_session_over_the_pool_against_the_bench_upstream(fast_upstream: str) -> None:
    async with httpx.AsyncClient() as client:
        up = AutoHttpUpstream("fast", fast_upstream, {}, client, fast=H1Pool("fast"))
        info = await up.start(Inbox())
        try:
            assert info.era == "legacy"
            calls = [up.request("tools/call", {"name": "echo", "arguments": {"text": f"m{i}"}}, timeout=10)
                     for i in range(50)]
            results = await asyncio.gather(*calls)
            assert [r["content"][0]["text"] for r in results] == [f"m{i}" for i in range(50)]
        finally:
            await up.close()


async def test_server_restart_over_the_pool_reinitializes(tmp_path: Path) -> None:
    server = HttpServer("streamable-http", tmp_path / "calls.jsonl").start()
    inbox = Inbox()
    try:
        async with httpx.AsyncClient() as client:
            up = AutoHttpUpstream("basic", server.base + "/mcp", {}, client, era="legacy", fast=H1Pool("basic"))
            await up.start(inbox)
            try:
                assert (await up.request("tools/call", {"name": "echo", "arguments": {"message": "a"}},
                                         timeout=10))["content"][0]["text"] == "a"
                server.restart()  # the pooled connection dies; the new server does not know our session
                result = await up.request("tools/call", {"name": "echo", "arguments": {"message": "b"}}, timeout=20)
                assert result["content"][0]["text"] == "b"
                await inbox.wait_for("notifications/tools/list_changed")
            finally:
                await up.close()
    finally:
        server.stop()


def test_request_heads_are_encoded_once_per_headers_and_carry_each_bodys_length() -> None:
    pool = H1Pool("t")
    target = Target.from_url("http://127.0.0.1:9/mcp")
    first = pool.encode(target, JSON, b"{}")
    assert first == (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAccept-Encoding: gzip, deflate\r\n"
                     b"Content-Length: 2\r\nContent-Type: application/json\r\n"
                     b"Accept: application/json, text/event-stream\r\n\r\n{}")
    assert pool.encode(target, JSON, b"[1, 2]").endswith(b"Content-Length: 6\r\nContent-Type: application/json\r\n"
                                                          b"Accept: application/json, text/event-stream\r\n\r\n[1, 2]")
    traced = pool.encode(target, {**JSON, "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, b"{}")
    assert b"\r\ntraceparent: 00-111" in traced and traced.endswith(b"\r\n\r\n{}")
    for _ in range(100):  # past the cache's bound: heads are made afresh, and still right
        pool.encode(target, {**JSON, "X-N": str(_)}, b"{}")
    assert pool.encode(target, JSON, b"{}") == first


@pytest.mark.parametrize("headers", [{"X-A": "a\r\nX-Injected: 1"}, {"X-A\n": "a"}, {"X-A": "a\x00"},
                                     {"X:A": "a"}, {"X-A": "\u20ac"}])
def test_request_heads_with_forbidden_characters_are_refused_every_time(headers: dict[str, str]) -> None:
    pool = H1Pool("t")
    target = Target.from_url("http://127.0.0.1:9/mcp")
    for _ in range(2):
        with pytest.raises(UpstreamUnavailable):
            pool.encode(target, headers, b"{}")
