"""Every response head an HTTP upstream sends is bounded, whichever client reads it: header lines in bytes and in
number (``bodies.MAX_HEAD_BYTES``, ``MAX_HEAD_LINES``), an unfinished head, chunk framing and trailers in bytes,
interim (1xx) answers in number. Past a bound the request fails as unavailable (-31002) and its connection is
dropped; other requests go on.

The upstream is a tiny asyncio HTTP server in the test's own loop, scripted byte for byte, so what the gateway
holds can be measured with ``tracemalloc`` and every connection counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from bastion.errors import UPSTREAM_UNAVAILABLE, UpstreamUnavailable
from bastion.upstream.base import Upstream
from bastion.upstream.bodies import MAX_HEAD_BYTES, MAX_HEAD_LINES, MAX_INTERIM
from bastion.upstream.config import UpstreamConfig, build_upstream
from bastion.upstream.connections import H1Pool, Target
from bastion.upstream.httpio import upstream_client
from tests.support.raw_http import read_request
from tests.upstream.helpers import Inbox

PAD = b"X-Pad: " + b"a" * 100 + b"\r\n"


def _json(rid: Any, text: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}]}})


def _head(lines: int, body: bytes, *, status: bytes = b"200 OK") -> bytes:
    """A head of exactly ``lines`` header lines (two of them Content-Type and Content-Length), then ``body``."""
    assert lines >= 2
    pads = b"".join(b"X-Pad-%d: x\r\n" % i for i in range(lines - 2))
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status, len(body), pads, body)


def _chunked(*parts: bytes, trailers: bytes = b"", extension: bytes = b"") -> bytes:
    out = [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"]
    out.extend(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in parts)
    out.append(b"0\r\n%s\r\n" % trailers)
    return b"".join(out)


Script = Callable[[Any, asyncio.StreamWriter], Awaitable[None]]


async def _write_forever(writer: asyncio.StreamWriter, piece: bytes, total: int) -> None:
    """Write ``total`` bytes of ``piece``; the client leaving ends it early."""
    with contextlib.suppress(ConnectionError):
        for _ in range(total // len(piece)):
            writer.write(piece)
            await writer.drain()
        await asyncio.sleep(3600)  # never finish the answer: only the client closing ends it


@dataclass
class Hostile:
    """A Streamable HTTP MCP server (handshake era, JSON answers) whose answers to ``tools/call`` of a scripted
    tool, to GET and to DELETE are what the test sets. ``echo`` always answers normally."""

    tools: dict[str, Script] = field(default_factory=dict)
    get: bytes = b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n"
    delete: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    connections: int = 0
    closed: int = 0
    session: bool = False  # give a session id at initialize
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/mcp"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                method, _, _, body = await read_request(reader)
                if method == "GET":
                    writer.write(self.get)
                    if not self.get.startswith(b"HTTP/1.1 405"):
                        await reader.read()  # a stream: open until the client leaves
                        return
                elif method == "DELETE":
                    writer.write(self.delete)
                else:
                    message = orjson.loads(body)
                    if "id" not in message:
                        writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
                    elif message["method"] == "tools/call" and message["params"]["name"] in self.tools:
                        await self.tools[message["params"]["name"]](message["id"], writer)
                    else:
                        answer = _head(2, orjson.dumps({"jsonrpc": "2.0", "id": message["id"],
                                                        "result": self.result(message)}))
                        if self.session and message["method"] == "initialize":
                            answer = answer.replace(b"\r\n\r\n", b"\r\nMcp-Session-Id: s1\r\n\r\n", 1)
                        writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()

    @staticmethod
    def result(message: dict[str, Any]) -> dict[str, Any]:
        name = message["method"]
        if name == "initialize":
            return {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile", "version": "1"}}
        if name == "tools/call":
            return {"content": [{"type": "text", "text": message["params"]["arguments"].get("message", "")}]}
        return {}


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    server = Hostile()
    server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    yield server
    server.server.close()


def _answer(rid: Any, text: str = "ok") -> bytes:
    return _json(rid, text)


def _scripted(make: Callable[[Any], bytes]) -> Script:
    async def script(rid: Any, writer: asyncio.StreamWriter) -> None:
        writer.write(make(rid))
    return script


async def _started(server: Hostile, client: str, http: Any) -> Upstream:
    cfg = UpstreamConfig.from_mapping("hostile", {"url": server.url, "era": "legacy", "http_client": client})
    up = build_upstream(cfg, http)
    await up.start(Inbox())
    return up


async def _call(up: Upstream, tool: str, message: str = "") -> str:
    result = await up.request("tools/call", {"name": tool, "arguments": {"message": message}}, timeout=10)
    text: str = result["content"][0]["text"]
    return text


async def _refused(up: Upstream, server: Hostile, tool: str) -> UpstreamUnavailable:
    """Call ``tool``: it must fail as unavailable, its connection must be dropped, and the next call must work."""
    assert await _call(up, "echo", "before") == "before"
    before = server.connections
    with pytest.raises(UpstreamUnavailable) as info:
        await _call(up, tool)
    assert info.value.code == UPSTREAM_UNAVAILABLE
    assert await _call(up, "echo", "after") == "after"
    assert server.connections > before, "the connection that carried the refused answer was reused"
    return info.value


CLIENTS = ["fast", "httpx"]


@pytest.mark.parametrize("client", CLIENTS)
async def test_many_repeated_header_lines_are_refused(hostile: Hostile, client: str) -> None:
    # The review's case: thousands of copies of one header before a valid body (joined quadratically before).
    hostile.tools["pad"] = _scripted(lambda rid: b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"%sContent-Length: %d\r\n\r\n%s" % (PAD * 20_000, len(_answer(rid)),
                                                                          _answer(rid)))
    async with upstream_client() as http:
        up = await _started(hostile, client, http)
        try:
            error = await _refused(up, hostile, "pad")
        finally:
            await up.close()
    assert f"over {MAX_HEAD_LINES} header lines" in (error.log_detail or "") or \
        "Receive buffer too long" in (error.log_detail or ""), error.log_detail


@pytest.mark.parametrize("client", CLIENTS)
async def test_the_line_bound_is_exact(hostile: Hostile, client: str) -> None:
    hostile.tools["at"] = _scripted(lambda rid: _head(MAX_HEAD_LINES, _answer(rid, "at the bound")))
    hostile.tools["over"] = _scripted(lambda rid: _head(MAX_HEAD_LINES + 1, _answer(rid)))
    async with upstream_client() as http:
        up = await _started(hostile, client, http)
        try:
            assert await _call(up, "at") == "at the bound"
            error = await _refused(up, hostile, "over")
        finally:
            await up.close()
    assert f"over {MAX_HEAD_LINES} header lines" in (error.log_detail or ""), error.log_detail


@pytest.mark.parametrize("client", CLIENTS)
async def test_one_long_header_line_is_refused(hostile: Hostile, client: str) -> None:
    # Few lines, many bytes: within h11's own 100 KiB, past ours.
    hostile.tools["long"] = _scripted(lambda rid: _head(2, _answer(rid)).replace(
        b"\r\n\r\n", b"\r\nX-Long: " + b"b" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n", 1))
    async with upstream_client() as http:
        up = await _started(hostile, client, http)
        try:
            error = await _refused(up, hostile, "long")
        finally:
            await up.close()
    assert f"over {MAX_HEAD_BYTES} bytes" in (error.log_detail or ""), error.log_detail


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("shape", ["one endless line", "endless lines"])
async def test_a_head_that_never_ends_is_refused_while_it_arrives(hostile: Hostile, client: str,
                                                                  shape: str) -> None:
    piece = b"b" * 65536 if shape == "one endless line" else PAD * 600
    total = 16 * 1024 * 1024

    async def endless(rid: Any, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Endless: ")
        await _write_forever(writer, piece, total)

    hostile.tools["endless"] = endless
    async with upstream_client() as http:
        up = await _started(hostile, client, http)
        try:
            assert await _call(up, "echo", "x") == "x"
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                with pytest.raises(UpstreamUnavailable) as info:
                    await _call(up, "endless")
                peak = tracemalloc.get_traced_memory()[1] - base
            finally:
                tracemalloc.stop()
            assert info.value.code == UPSTREAM_UNAVAILABLE
            # What one read brings in and the parser holds, never the 16 MiB the server meant to send.
            assert peak < 2 * 1024 * 1024, f"{peak} bytes held for an endless head"
            assert await _call(up, "echo", "after") == "after"
        finally:
            await up.close()


async def test_interim_answers_are_bounded_in_number(hostile: Hostile) -> None:
    hint = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    hostile.tools["hinted"] = _scripted(lambda rid: hint + _head(2, _answer(rid, "hinted")))
    hostile.tools["flood"] = _scripted(lambda rid: hint * (MAX_INTERIM + 1) + _head(2, _answer(rid)))
    async with upstream_client() as http:
        up = await _started(hostile, "fast", http)
        try:
            assert await _call(up, "hinted") == "hinted"
            error = await _refused(up, hostile, "flood")
        finally:
            await up.close()
    assert f"more than {MAX_INTERIM} interim" in (error.log_detail or ""), error.log_detail


async def test_interim_answers_draw_on_the_same_line_budget(hostile: Hostile) -> None:
    hint = b"HTTP/1.1 103 Early Hints\r\n" + b"Link: </a.css>; rel=preload\r\n" * 40 + b"\r\n"
    hostile.tools["hints"] = _scripted(lambda rid: hint * 3 + _head(2, _answer(rid)))
    async with upstream_client() as http:
        up = await _started(hostile, "fast", http)
        try:
            error = await _refused(up, hostile, "hints")
        finally:
            await up.close()
    assert f"over {MAX_HEAD_LINES} header lines" in (error.log_detail or ""), error.log_detail


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_long_chunk_extension_is_refused(hostile: Hostile, client: str) -> None:
    # No body byte comes of it, so it would be read for ever; h11 bounds a chunk line at 100 KiB, we at 64.
    hostile.tools["ext"] = _scripted(lambda rid: _chunked(_answer(rid), extension=b";x=" + b"e" * 200_000))
    async with upstream_client() as http:
        up = await _started(hostile, client, http)
        try:
            await _refused(up, hostile, "ext")
        finally:
            await up.close()


@pytest.mark.parametrize("client", CLIENTS)
async def test_trailers_are_ignored_and_bounded(hostile: Hostile, client: str) -> None:
    hostile.tools["trailed"] = _scripted(lambda rid: _chunked(_answer(rid, "trailed"), trailers=b"X-Sum: 1\r\n"))
    hostile.tools["trailers"] = _scripted(lambda rid: _chunked(_answer(rid), trailers=PAD * 1000))
    async with upstream_client() as http:
        up = await _started(hostile, client, http)
        try:
            assert await _call(up, "trailed") == "trailed"
            if client == "fast":
                await _refused(up, hostile, "trailers")
            else:  # h11 reads trailers within its 100 KiB and httpcore drops them; still one bounded read
                assert await _call(up, "trailers") == "ok"
        finally:
            await up.close()


# -- the lean pool's headers, directly ----------------------------------------------------------------------------


async def test_repeated_headers_are_joined_once_and_interim_headers_dropped() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\nVary: hint\r\n\r\n"
                     b"HTTP/1.1 200 OK\r\nVary: a\r\nContent-Length: 2\r\nVary: b\r\nX-One: 1\r\nvary: c\r\n"
                     b"Trailer-Free: yes\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    pool = H1Pool("t")
    try:
        port = server.sockets[0].getsockname()[1]
        async with pool.post(Target.from_url(f"http://127.0.0.1:{port}/mcp"), {}, b"{}") as response:
            assert response.status_code == 200
            assert await response.aread() == b"{}"
            assert dict(response.headers) == {"vary": "a, b, c", "content-length": "2", "x-one": "1",
                                              "trailer-free": "yes"}
    finally:
        await pool.aclose()
        server.close()


# -- the httpx-only paths: the GET stream, DELETE, the HTTP+SSE transport ----------------------------------------------


async def test_a_get_stream_with_an_oversized_head_is_dropped(hostile: Hostile) -> None:
    hostile.get = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + PAD * (MAX_HEAD_LINES + 1)
                   + b"Transfer-Encoding: chunked\r\n\r\n")
    async with upstream_client() as http:
        with capture_logs() as logs:
            up = await _started(hostile, "fast", http)  # start waits for the stream's answer
            try:
                async with asyncio.timeout(15):
                    while not any(e["event"] == "upstream.get_stream_failed" for e in logs):
                        await asyncio.sleep(0.01)
            finally:
                await up.close()
    failed = [e for e in logs if e["event"] == "upstream.get_stream_failed"]
    assert f"over {MAX_HEAD_LINES} header lines" in failed[0]["detail"]


async def test_the_answer_to_delete_is_bounded_too(hostile: Hostile) -> None:
    hostile.session = True  # so that close ends the session with DELETE
    hostile.delete = _head(MAX_HEAD_LINES + 1, b"")
    async with upstream_client() as http:
        up = await _started(hostile, "fast", http)
        assert await _call(up, "echo", "x") == "x"
        with capture_logs() as logs:
            await up.close()
    failed = [e for e in logs if e["event"] == "upstream.delete_failed"]
    assert f"over {MAX_HEAD_LINES} header lines" in failed[0]["detail"]


async def test_the_http_sse_transport_refuses_an_oversized_stream_head(hostile: Hostile) -> None:
    hostile.get = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + PAD * (MAX_HEAD_LINES + 1)
                   + b"Transfer-Encoding: chunked\r\n\r\n")
    cfg = UpstreamConfig.from_mapping("hostile", {"url": hostile.url, "transport": "sse"})
    async with upstream_client() as http:
        up = build_upstream(cfg, http)
        try:
            with pytest.raises(UpstreamUnavailable) as info:
                await up.start(Inbox())
        finally:
            await up.close()
    assert f"over {MAX_HEAD_LINES} header lines" in (info.value.log_detail or ""), info.value.log_detail
    async with asyncio.timeout(15):  # the stream's connection was dropped: the server sees it end
        while hostile.closed < hostile.connections:
            await asyncio.sleep(0.01)
