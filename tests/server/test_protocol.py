"""The front door's HTTP protocol limits, over real sockets: uvicorn with bastion's protocol class in this process,
driven by raw asyncio streams so that malformed and slow HTTP can be sent byte by byte."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from bastion.errors import Refused
from bastion.server.checks import FRONT_LINES, front_lines
from bastion.server.protocol import FrontDoorOptions, front_door_protocol
from tests.support.net import free_port
from tests.support.uvicorn_server import serving


@dataclass
class Front:
    port: int
    refusals: list[tuple[int, str, str | None, str | None]] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)
    served: list[dict[str, Any]] = field(default_factory=list)

    def reasons(self) -> list[str]:
        return [r[1] for r in self.refusals]


async def _echo_app(front: Front, scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    request = Request(scope, receive)
    try:
        body = await request.body()
    except ClientDisconnect:
        front.disconnects.append(scope["path"])
        return
    doc = {"method": scope["method"], "path": scope["path"], "body": len(body),
           "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]]}
    lines = scope.get(FRONT_LINES)
    if lines is not None:
        # What the protocol gathered for the MCP endpoint, next to what front_lines makes of the same head.
        again = front_lines(scope["headers"])
        doc["front_lines"] = [lines.lines == again.lines, lines.first == again.first,
                              lines.duplicate == again.duplicate, (lines.duplicate or b"").decode()]
    front.served.append(doc)
    payload = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


@contextlib.asynccontextmanager
async def serve(keep_alive: int = 1, **limits: Any) -> AsyncIterator[Front]:
    front = Front(port=free_port())

    def report(refused: Refused, addr: str | None, method: str | None, path: str | None, _tp: str | None) -> None:
        front.refusals.append((refused.status, refused.reason, method, path))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await _echo_app(front, scope, receive, send)

    options = FrontDoorOptions(**{"request_timeout_s": 10.0, **limits}, report=report)
    config = uvicorn.Config(app, host="127.0.0.1", port=front.port, http=front_door_protocol(options), ws="none",
                            lifespan="off", log_config=None, access_log=False, timeout_keep_alive=keep_alive)
    async with serving(config):
        yield front


async def exchange(port: int, *parts: bytes, pause: float = 0.0, timeout: float = 5.0) -> bytes:
    """Send the parts (pausing between them), then read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i, part in enumerate(parts):
            if i and pause:
                await asyncio.sleep(pause)
            writer.write(part)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def statuses(raw: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", raw)]


def error_body(raw: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    return doc


def request(method: str = "POST", target: str = "/mcp", headers: list[tuple[str, str]] | None = None,
            body: bytes = b"{}", version: str = "1.1", close: bool = True) -> bytes:
    lines = [f"{method} {target} HTTP/{version}", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers or []]
    if body and not any(k.lower() == "transfer-encoding" for k, _ in headers or []):
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def test_a_plain_request_is_served() -> None:
    async with serve() as front:
        raw = await exchange(front.port, request(headers=[("Content-Type", "application/json")]))
    assert statuses(raw) == [200]
    assert front.refusals == []


async def test_request_target_over_the_limit_is_414() -> None:
    async with serve(max_target_bytes=1024) as front:
        ok = await exchange(front.port, request(target="/mcp?" + "a" * 1000))
        raw = await exchange(front.port, request(target="/mcp?" + "a" * 1100))
    assert statuses(ok) == [200]
    assert statuses(raw) == [414]
    assert error_body(raw)["error"]["message"] == "URI Too Long"
    assert front.refusals == [(414, "uri_too_long", "POST", "/mcp?" + "a" * 251)]


async def test_a_target_arriving_in_pieces_is_measured_whole() -> None:
    async with serve(max_target_bytes=1024) as front:
        head = request(target="/mcp?" + "a" * 3000)
        raw = await exchange(front.port, *(head[i:i + 100] for i in range(0, len(head), 100)))
    assert statuses(raw) == [414]


async def test_header_section_over_the_limit_is_431() -> None:
    async with serve(max_header_bytes=4096, max_target_bytes=1024) as front:
        ok = await exchange(front.port, request(headers=[(f"X-H{i}", "v" * 90) for i in range(30)]))
        raw = await exchange(front.port, request(headers=[(f"X-H{i}", "v" * 90) for i in range(50)]))
    assert statuses(ok) == [200]
    assert statuses(raw) == [431]
    assert front.reasons() == ["header_too_large"]


async def test_one_endless_header_line_is_cut_off_while_it_streams() -> None:
    """No callback sees a header line until it ends; the raw byte count still stops it at the limit."""
    async with serve(max_header_bytes=4096, max_target_bytes=1024) as front:
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(b"GET /mcp HTTP/1.1\r\nHost: x\r\nX-Long: ")
        for _ in range(20):
            writer.write(b"v" * 1024)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert statuses(raw) == [431]
    assert front.reasons() == ["header_too_large"]


async def test_too_many_header_lines_is_431() -> None:
    async with serve(max_headers=20) as front:
        # Host and Connection count: 18 more make 20 lines, Content-Length the 21st.
        ok = await exchange(front.port, request(headers=[(f"X-{i}", "1") for i in range(18)], body=b""))
        raw = await exchange(front.port, request(headers=[(f"X-{i}", "1") for i in range(19)]))
    assert statuses(ok) == [200]
    assert statuses(raw) == [431]
    assert front.reasons() == ["too_many_headers"]


@pytest.mark.parametrize("codings", [
    ["gzip"], ["gzip, chunked"], ["chunked, chunked"], ["chunked", "chunked"], ["identity"], ["chunked;x=1"],
])
async def test_transfer_codings_other_than_plain_chunked_are_501(codings: list[str]) -> None:
    async with serve() as front:
        raw = await exchange(front.port, request(headers=[("Transfer-Encoding", c) for c in codings],
                                                 body=b"0\r\n\r\n"))
    assert statuses(raw) == [501], raw
    assert front.reasons() == ["transfer_encoding"]
    assert front.served == []


async def test_plain_chunked_in_any_case_is_served() -> None:
    async with serve() as front:
        raw = await exchange(front.port, request(headers=[("Transfer-Encoding", " Chunked ")],
                                                 body=b"2\r\n{}\r\n0\r\n\r\n"))
    assert statuses(raw) == [200]
    assert front.served[0]["body"] == 2


async def test_transfer_encoding_in_http_1_0_is_400() -> None:
    async with serve() as front:
        raw = await exchange(front.port, request(version="1.0", headers=[("Transfer-Encoding", "chunked")],
                                                 body=b"0\r\n\r\n"))
    assert statuses(raw) == [400]
    assert front.reasons() == ["transfer_encoding"]


async def test_transfer_encoding_with_content_length_is_refused_as_smuggling() -> None:
    async with serve() as front:
        raw = await exchange(front.port, b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert statuses(raw) == [400]
    assert front.reasons() == ["malformed"]
    assert front.served == []


async def test_unknown_method_is_501_and_garbage_is_400() -> None:
    async with serve() as front:
        unknown = await exchange(front.port, b"BREW /mcp HTTP/1.1\r\nHost: x\r\n\r\n")
        garbage = await exchange(front.port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        folded = await exchange(front.port, b"GET /mcp HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n")
    assert statuses(unknown) == [501]
    assert statuses(garbage) == [400]
    assert statuses(folded) == [400]
    assert front.reasons() == ["method", "malformed", "malformed"]


async def test_slow_head_gets_408_and_the_connection_closes() -> None:
    async with serve(request_timeout_s=0.5) as front:
        loop = asyncio.get_running_loop()
        start = loop.time()
        raw = await exchange(front.port, b"POST /mcp HTTP/1.1\r\n", b"Host: x\r\n", b"X-A: 1\r\n", pause=0.2)
        elapsed = loop.time() - start
    assert statuses(raw) == [408]
    assert elapsed < 3
    assert front.reasons() == ["request_timeout"]


async def test_a_silent_connection_is_closed_without_an_answer() -> None:
    async with serve(request_timeout_s=0.3) as front:
        raw = await exchange(front.port)
    assert raw == b""
    assert front.reasons() == ["request_timeout"]


async def test_a_slow_body_gets_408_and_the_app_sees_a_disconnect() -> None:
    async with serve(request_timeout_s=0.5) as front:
        raw = await exchange(front.port, b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{", b"}",
                             pause=1.0)
        for _ in range(50):
            if front.disconnects:
                break
            await asyncio.sleep(0.02)
    assert statuses(raw) == [408]
    assert front.disconnects == ["/slow"]
    assert front.served == []


async def test_the_deadline_covers_each_request_on_a_keep_alive_connection() -> None:
    async with serve(request_timeout_s=0.5) as front:
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(request(body=b"", close=False))
        first = await asyncio.wait_for(reader.readuntil(b"}"), 5)
        await asyncio.sleep(0.3)  # idle, but within keep-alive (1 s)
        writer.write(b"GET /mcp HTTP/1.1\r\n")  # then too slow with the rest of the head
        rest = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert statuses(first) == [200]
    assert statuses(rest) == [408]


async def test_idle_keep_alive_connections_are_closed() -> None:
    async with serve() as front:
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(request(body=b"", close=False))
        raw = await asyncio.wait_for(reader.read(), 5)  # returns once the server closes (keep-alive 1 s)
        writer.close()
    assert statuses(raw) == [200]
    assert front.refusals == []


async def test_the_keep_alive_wait_starts_again_after_every_response() -> None:
    # One timer per connection serves the request deadline and the keep-alive wait: a connection that is never
    # idle for the whole keep-alive (2 s) stays open however long it lives (8 requests 0.5 s apart: 4 s), and one
    # that then goes quiet is closed about the keep-alive after its last response, not a request timeout (10 s)
    # later. The 1.5 s between a pause and the keep-alive is the margin a loaded machine needs.
    async with serve(keep_alive=2) as front:
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        raw = b""
        for _ in range(8):
            writer.write(request(body=b"", close=False))
            raw += await asyncio.wait_for(reader.readuntil(b"}"), 5)
            await asyncio.sleep(0.5)
        quiet = time.monotonic()
        raw += await asyncio.wait_for(reader.read(), 8)  # returns once the server closes
        idle = time.monotonic() - quiet
        writer.close()
    assert statuses(raw) == [200] * 8
    assert 1.0 <= idle < 6.0
    assert front.refusals == []


async def test_pipelined_requests_are_each_served() -> None:
    async with serve(max_header_bytes=1024, max_target_bytes=512) as front:
        one = request(body=b"{}", close=False)
        raw = await exchange(front.port, one * 20 + request(body=b"{}"))
    assert statuses(raw) == [200] * 21
    assert front.refusals == []


async def test_an_answer_reaches_a_client_that_is_still_sending() -> None:
    """Lingering close: the refused client's remaining bytes are drained, so it reads 431 rather than a reset."""
    async with serve(max_header_bytes=4096, max_target_bytes=1024) as front:
        raw = await exchange(front.port, b"GET /mcp HTTP/1.1\r\nHost: x\r\n" + b"X-A: 1\r\n" * 60_000)
    assert statuses(raw) == [431]


async def test_the_endpoints_header_lines_are_gathered_while_parsing() -> None:
    """The lines the MCP endpoint checks (trimmed, first value per name, the first duplicated singleton) come from
    the parser callbacks, and equal what ``front_lines`` makes of the scope's headers, over pipelined requests."""
    async with serve() as front:
        await exchange(front.port,
                       request(headers=[("Mcp-Name", "  echo  "), ("X-Twice", "a"), ("x-twice", " b ")], close=False),
                       request(headers=[("Origin", "http://a"), ("ORIGIN", "http://b"), ("Host", "x")], close=False),
                       request(headers=[("Mcp-Method", "tools/call")], close=True))
    assert [doc["front_lines"] for doc in front.served] == [
        [True, True, True, ""], [True, True, True, "origin"], [True, True, True, ""]]


async def test_header_values_reach_the_app_as_sent() -> None:
    """The protocol does not rewrite headers (trimming is the app's, in ``front_headers``), so every server
    bastion can run on gets the same treatment."""
    async with serve() as front:
        await exchange(front.port, request(headers=[("Mcp-Name", "  echo  ")]))
    assert ["mcp-name", "echo  "] in front.served[0]["headers"]
