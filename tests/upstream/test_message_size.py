"""``max_message_size``: one limit per message from an upstream, on every transport and HTTP client, measured once
content-decoded and enforced while reading.

The HTTP servers here are tiny asyncio servers in the test's own loop, so what the gateway buffers can be measured
with ``tracemalloc`` (a gzip bomb decoded whole would show as its decoded size) and every connection counted. The
bombs are built with ``zlib`` piece by piece, so the servers never hold their decoded size either.
"""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from structlog.testing import capture_logs

from bastion.errors import UPSTREAM_UNAVAILABLE, UpstreamUnavailable
from bastion.upstream.base import Upstream
from bastion.upstream.bodies import ContentDecoder, read_limited
from bastion.upstream.config import UpstreamConfig, build_upstream
from bastion.upstream.stdio import StdioUpstream
from tests.support.raw_http import read_request
from tests.upstream.helpers import ROOT, Inbox, server_command

LIMIT = 1024 * 1024
BOMB = 16 * LIMIT  # what a bomb decodes to
# Far below a bomb's decoded size, well above the limit: what one bounded read may hold at its peak.
PEAK = 6 * LIMIT
_FILL = b"a" * 65536


def _squeezed(head: bytes, size: int, tail: bytes, *, wbits: int = 31) -> bytes:
    """``head``, ``size`` bytes of filler and ``tail``, compressed without ever holding the filler whole."""
    z = zlib.compressobj(9, zlib.DEFLATED, wbits)
    out = [z.compress(head)]
    out.extend(z.compress(_FILL) for _ in range(size // len(_FILL)))
    out.append(z.compress(tail))
    out.append(z.flush())
    return b"".join(out)


def _text_result(rid: Any, text: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s"}]}}' % (
        orjson.dumps(rid), text)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class TinyMcp:
    """A Streamable HTTP MCP server of either era (JSON or SSE answers, no GET stream), and a legacy HTTP+SSE one
    (GET ``/sse``, whose stream is gzip-encoded, and POST ``/messages``). Tools: ``echo``; ``bomb`` (a gzip body
    decoding to ``BOMB`` bytes), ``error_bomb`` (the same with status 500), ``sse_bomb`` (an SSE answer, gzip,
    whose one event decodes to ``BOMB`` bytes), ``sse_big`` (an unencoded SSE event that never ends: the limit
    must be enforced while it arrives)."""

    connections: int = 0
    closed: int = 0
    server: asyncio.Server | None = None
    stream: asyncio.StreamWriter | None = None
    stream_gzip: Any = None
    session: bool = False  # give a session at initialize, and answer its DELETE with a bomb

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                method, path, _, body = await read_request(reader)
                if not await self.answer(method, path, body, reader, writer):
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()

    async def answer(self, method: str, path: str, body: bytes, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/sse":
            await self.open_stream(writer)
            await reader.read()  # the stream stays open until the client leaves
            return False
        if method == "DELETE":
            payload = _squeezed(b"", BOMB, b"")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(payload), payload))
            return True
        if method != "POST":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return True
        message = orjson.loads(body)
        if path == "/messages":
            writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            if "id" in message:
                await self.on_stream(message)
            return True
        if "id" not in message:
            writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
            return True
        rid, name = message["id"], message["method"]
        if name == "tools/call":
            name = message["params"]["name"]
        if name == "bomb" or name == "error_bomb":
            status = b"200 OK" if name == "bomb" else b"500 Internal Server Error"
            payload = _squeezed(_text_result(rid, b"")[:-5], BOMB, b'"}]}}')
            writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (status, len(payload), payload))
            return True
        if name in ("sse_bomb", "sse_big"):
            coding = b"Content-Encoding: gzip\r\n" if name == "sse_bomb" else b""
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n%s"
                         b"\r\n" % coding)
            if name == "sse_bomb":
                writer.write(_chunk(_squeezed(b"event: message\ndata: " + _text_result(rid, b"")[:-5], BOMB,
                                              b'"}]}}\n\n')))
                writer.write(b"0\r\n\r\n")
                return True
            writer.write(_chunk(b"event: message\ndata: " + _text_result(rid, b"")[:-5]))
            for _ in range(2 * LIMIT // len(_FILL)):
                writer.write(_chunk(_FILL))
                await writer.drain()
            await reader.read()  # the event never ends: only the client leaving ends this answer
            return False
        answer = orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": self.result(message)})
        session = b"Mcp-Session-Id: s1\r\n" if self.session and name == "initialize" else b""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                     % (len(answer), session, answer))
        return True

    @staticmethod
    def result(message: dict[str, Any]) -> dict[str, Any]:
        name = message["method"]
        if name == "initialize":
            return {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "tiny", "version": "1"}}
        if name == "server/discover":
            return {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
        if name == "tools/call":
            return {"content": [{"type": "text", "text": message["params"]["arguments"]["message"]}]}
        return {}

    # -- the legacy HTTP+SSE transport ---------------------------------------------------------------------------

    async def open_stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        self.stream, self.stream_gzip = writer, zlib.compressobj(9, zlib.DEFLATED, 31)
        await self.send(b"event: endpoint\ndata: /messages\n\n")

    async def send(self, *parts: bytes, fill: int = 0) -> None:
        writer, z = self.stream, self.stream_gzip
        assert writer is not None and z is not None
        out = [z.compress(parts[0])]
        out.extend(z.compress(_FILL) for _ in range(fill // len(_FILL)))
        out.extend(z.compress(part) for part in parts[1:])
        out.append(z.flush(zlib.Z_SYNC_FLUSH))
        writer.write(_chunk(b"".join(out)))
        await writer.drain()

    async def on_stream(self, message: dict[str, Any]) -> None:
        rid = message["id"]
        if message["method"] == "tools/call" and message["params"]["name"] == "sse_bomb":
            await self.send(b"event: message\ndata: " + _text_result(rid, b"")[:-5], b'"}]}}\n\n', fill=BOMB)
            return
        answer = orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": self.result(message)})
        await self.send(b"event: message\ndata: " + answer + b"\n\n")


@pytest.fixture
async def tiny() -> AsyncIterator[TinyMcp]:
    server = TinyMcp()
    server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    yield server
    server.server.close()


async def _peak(call: Callable[[], Awaitable[Any]]) -> tuple[BaseException | None, int]:
    """What ``call`` raised, and the most memory Python held at once while it ran, above what it held before."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        try:
            await call()
        except Exception as exc:
            raised: BaseException | None = exc
        else:
            raised = None
        return raised, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


async def _echo(up: Upstream, message: str = "still here") -> str:
    result = await up.request("tools/call", {"name": "echo", "arguments": {"message": message}}, timeout=10)
    text: str = result["content"][0]["text"]
    return text


@pytest.mark.parametrize("client", ["fast", "httpx"])
@pytest.mark.parametrize("era", ["legacy", "modern"])
@pytest.mark.parametrize("tool", ["bomb", "error_bomb", "sse_bomb", "sse_big"])
async def test_an_answer_over_the_limit_fails_the_call_and_only_it(tiny: TinyMcp, client: str, era: str,
                                                                    tool: str) -> None:
    cfg = UpstreamConfig.from_mapping("tiny", {"url": tiny.url + "/mcp", "era": era, "http_client": client,
                                               "max_message_size": "1MiB"})
    async with httpx.AsyncClient() as http:
        up = build_upstream(cfg, http)
        await up.start(Inbox())
        try:
            assert await _echo(up) == "still here"
            before = tiny.connections

            async def call() -> None:
                await up.request("tools/call", {"name": tool, "arguments": {}}, timeout=10)

            raised, peak = await _peak(call)
            assert isinstance(raised, UpstreamUnavailable), raised
            assert raised.code == UPSTREAM_UNAVAILABLE
            assert "exceeds max_message_size (1048576 bytes" in (raised.log_detail or "")
            assert peak < PEAK, f"{peak} bytes held while refusing a {BOMB}-byte answer"
            # The next call works, on a new connection: the one that carried the answer was dropped.
            assert await _echo(up, "after") == "after"
            assert tiny.connections > before
        finally:
            await up.close()


async def test_the_answer_to_the_session_delete_is_bounded_too(tiny: TinyMcp) -> None:
    tiny.session = True
    cfg = UpstreamConfig.from_mapping("tiny", {"url": tiny.url + "/mcp", "era": "legacy", "max_message_size": "1MiB"})
    async with httpx.AsyncClient() as http:
        up = build_upstream(cfg, http)
        await up.start(Inbox())
        assert await _echo(up) == "still here"
        with capture_logs() as logs:
            raised, peak = await _peak(up.close)
    assert raised is None
    assert peak < PEAK, f"{peak} bytes held while refusing a {BOMB}-byte answer to DELETE"
    failed = [e for e in logs if e["event"] == "upstream.delete_failed"]
    assert "exceeds max_message_size" in failed[0]["detail"]


async def test_legacy_sse_stream_event_over_the_limit_drops_the_stream_then_reconnects(tiny: TinyMcp) -> None:
    cfg = UpstreamConfig.from_mapping("tiny", {"url": tiny.url + "/sse", "transport": "sse",
                                               "max_message_size": "1MiB"})
    inbox = Inbox()
    async with httpx.AsyncClient() as http:
        up = build_upstream(cfg, http)
        await up.start(inbox)
        try:
            assert await _echo(up) == "still here"

            async def call() -> None:
                await up.request("tools/call", {"name": "sse_bomb", "arguments": {}}, timeout=10)

            raised, peak = await _peak(call)
            assert isinstance(raised, UpstreamUnavailable), raised
            assert peak < PEAK, f"{peak} bytes held while refusing a {BOMB}-byte event"
            await inbox.wait_for("notifications/tools/list_changed")  # reconnected: a new stream and session
            assert await _echo(up, "after") == "after"
        finally:
            await up.close()


async def test_stdio_takes_the_same_setting() -> None:
    cfg = UpstreamConfig.from_mapping("basic", {"command": server_command(), "cwd": str(ROOT), "era": "legacy",
                                                "max_message_size": "64KiB"})
    async with httpx.AsyncClient() as http:
        up = build_upstream(cfg, http)
    assert isinstance(up, StdioUpstream)
    inbox = Inbox()
    await up.start(inbox)
    try:
        assert await _echo(up, "x" * 1000) == "x" * 1000
        with pytest.raises(UpstreamUnavailable):
            await _echo(up, "x" * 100_000)
        await inbox.wait_for("notifications/tools/list_changed")  # the child was restarted
        assert await _echo(up, "back") == "back"
    finally:
        await up.close()


async def test_stdio_messages_far_larger_than_the_pipes_read_ahead_still_pass_whole() -> None:
    """The stdout pipe is read a little at a time (``upstream.lines``), yet a message up to max_message_size
    arrives whole, and one past it still fails."""
    cfg = UpstreamConfig.from_mapping("basic", {"command": server_command(), "cwd": str(ROOT), "era": "legacy",
                                                "max_message_size": "4MiB"})
    async with httpx.AsyncClient() as http:
        up = build_upstream(cfg, http)
    inbox = Inbox()
    await up.start(inbox)
    try:
        big = "x" * 3_000_000
        assert await _echo(up, big) == big
        with pytest.raises(UpstreamUnavailable):
            await _echo(up, "x" * 5_000_000)
        await inbox.wait_for("notifications/tools/list_changed")  # the child was restarted
        assert await _echo(up, big) == big
    finally:
        await up.close()


def test_the_setting_is_a_size_and_defaults_to_64_mib() -> None:
    from bastion.errors import ConfigError

    assert UpstreamConfig.from_mapping("a", {"url": "http://h/mcp"}).max_message_bytes == 64 * 1024 * 1024
    stdio = UpstreamConfig.from_mapping("a", {"command": ["x"], "max_message_size": "2MB"})
    assert stdio.max_message_bytes == 2_000_000
    with pytest.raises(ConfigError) as info:
        UpstreamConfig.from_mapping("a", {"url": "http://h/mcp", "max_message_size": "lots"})
    assert info.value.path == "upstreams.a.max_message_size"


# -- the pieces, over scripted bytes ----------------------------------------------------------------------------


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.mark.parametrize("coding", [None, "gzip", "deflate"])
async def test_a_body_at_the_limit_passes_and_one_byte_more_does_not(coding: str | None) -> None:
    def encode(data: bytes) -> bytes:
        if coding == "gzip":
            return gzip.compress(data)
        return zlib.compress(data) if coding == "deflate" else data

    headers = {"content-encoding": coding} if coding else {}
    body = b"b" * 1000
    wire = encode(body)
    pieces = [wire[i:i + 7] for i in range(0, len(wire), 7)]
    read = await read_limited("u", _chunks(*pieces), ContentDecoder.for_headers("u", headers), 1000)
    assert read == body
    with pytest.raises(UpstreamUnavailable) as info:
        await read_limited("u", _chunks(*pieces), ContentDecoder.for_headers("u", headers), 999)
    assert "exceeds max_message_size (999 bytes" in (info.value.log_detail or "")


def test_a_decoder_never_produces_more_than_a_piece_at_once() -> None:
    decoder = ContentDecoder.for_headers("u", {"content-encoding": "gzip"})
    assert decoder is not None
    bomb = _squeezed(b"", 4 * 1024 * 1024, b"")
    sizes = [len(piece) for piece in decoder.pieces(bomb, 65536)]
    assert max(sizes) == 65536
    assert sum(sizes) + len(decoder.flush()) == 4 * 1024 * 1024


def test_unsupported_coding_is_unavailable() -> None:
    with pytest.raises(UpstreamUnavailable) as info:
        ContentDecoder.for_headers("u", {"content-encoding": "br"})
    assert "unsupported content-encoding 'br'" in (info.value.log_detail or "")
