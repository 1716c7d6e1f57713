"""A response of declared length leaves in one write (head and body together); every other response leaves as
uvicorn writes it. Real uvicorn, real sockets; the protocol's transport is wrapped only to record its writes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest
import uvicorn
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from bastion.server.answer import JsonResponse
from bastion.server.protocol import FrontDoorOptions, deliver, front_door_protocol, whole_body
from tests.support.net import free_port
from tests.support.uvicorn_server import serving


class _Recorded:
    """The real transport, with each ``write`` (and each gathering ``writelines``, as one) also kept in ``writes``;
    ``gathered`` holds the parts of each ``writelines``."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes], gathered: list[list[bytes]]) -> None:
        self._transport = transport
        self._writes = writes
        self._gathered = gathered

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def writelines(self, parts: Iterable[bytes]) -> None:
        parts = [bytes(p) for p in parts]
        self._gathered.append(parts)
        self._writes.append(b"".join(parts))
        self._transport.writelines(parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


BIG = b'"' + b"x" * (256 * 1024) + b'"'  # a body past the size from which the head is gathered, not copied
WHOLE: list[bool] = []  # what each ``deliver`` in the app returned


async def _body_app(receive: Receive, send: Send) -> None:
    """Reads the body as the MCP endpoint does (``whole_body``, else ``receive``) and says which way it came."""
    body = whole_body(receive)
    whole = body is not None
    if body is None:
        parts, more = [], True
        while more:
            message = await receive()
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(parts)
    out = b'{"whole":%s,"sha":"%s"}' % (b"true" if whole else b"false", hashlib.sha256(body).hexdigest().encode())
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/body":
        await _body_app(receive, send)
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    path = scope["path"]
    if path.startswith(("/deliver/", "/asgi/", "/jdeliver/")):
        # The same starlette response, through ``deliver`` (send_whole) or through ASGI messages; ``jdeliver``:
        # bastion's pre-encoded JsonResponse through ``deliver``, which must write the same bytes.
        kind, _, what = path[1:].partition("/")
        headers = {"Mcp-Session-Id": "abc"} if what != "close" else {"Connection": "close"}
        body = BIG if what == "big" else b'{"ok":true}'
        response = JsonResponse(body, 201, headers) if kind == "jdeliver" else \
            Response(body, status_code=201, media_type="application/json", headers=headers)
        if kind in ("deliver", "jdeliver"):
            WHOLE.append(await deliver(response, scope, receive, send))
        else:
            await response(scope, receive, send)
        return
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await send({"type": "http.response.body", "body": b"two"})
        return
    if path == "/big":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BIG))]})
        await send({"type": "http.response.body", "body": BIG})
        return
    if path == "/empty":
        await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")]})
    if path == "/fail":
        raise RuntimeError("the app fails between head and body")
    await send({"type": "http.response.body", "body": b'{"ok":true}'})


@contextlib.asynccontextmanager
async def serve(gathered: list[list[bytes]] | None = None) -> AsyncIterator[tuple[int, list[bytes]]]:
    port = free_port()
    writes: list[bytes] = []
    gathers = [] if gathered is None else gathered
    base = front_door_protocol(FrontDoorOptions())

    class Recording(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(_Recorded(transport, writes, gathers))

    config = uvicorn.Config(_app, host="127.0.0.1", port=port, http=Recording, ws="none", lifespan="off",
                            log_config=None, access_log=False, date_header=False, server_header=False)
    async with serving(config):
        yield port, writes


async def _get(port: int, method: str, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_a_json_answer_is_one_write_with_the_same_bytes() -> None:
    async with serve() as (port, writes):
        raw = await _get(port, "GET", "/json")
    assert raw == (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n"
                   b"connection: close\r\n\r\n{\"ok\":true}")
    assert writes == [raw]


async def test_a_big_answer_is_one_gathering_write_of_head_and_body() -> None:
    """The body is handed to the transport as it is (not copied behind the head), in the same call as the head."""
    gathered: list[list[bytes]] = []
    async with serve(gathered) as (port, writes):
        raw = await _get(port, "GET", "/big")
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % len(BIG))
    assert raw == head + BIG
    assert writes == [raw]
    assert gathered == [[head, BIG]]


async def test_a_small_answer_is_not_a_gathering_write() -> None:
    gathered: list[list[bytes]] = []
    async with serve(gathered) as (port, writes):
        raw = await _get(port, "GET", "/json")
    assert writes == [raw]
    assert gathered == []


async def test_an_empty_answer_of_declared_length_is_one_write() -> None:
    async with serve() as (port, writes):
        raw = await _get(port, "GET", "/empty")
    assert raw == b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    assert writes == [raw]


async def test_a_streamed_answer_sends_its_head_at_once() -> None:
    async with serve() as (port, writes):
        raw = await _get(port, "GET", "/stream")
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n"
    assert raw == head + b"3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n"
    assert writes[0] == head


async def test_a_head_request_gets_its_head_alone() -> None:
    async with serve() as (port, writes):
        raw = await _get(port, "HEAD", "/json")
    assert raw == (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n"
                   b"connection: close\r\n\r\n")
    assert writes[0] == raw


async def test_an_app_failing_after_the_head_still_sends_the_head_before_closing() -> None:
    """As uvicorn alone does: the head was sent, the body never comes, the connection closes."""
    async with serve() as (port, writes):
        raw = await _get(port, "GET", "/fail")
    assert raw == (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n"
                   b"connection: close\r\n\r\n")
    assert writes == [raw]


async def _exchange(port: int, requests: list[bytes]) -> bytes:
    """Send the requests pipelined on one connection; read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(requests))
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _req(method: str, path: str, close: bool = False) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + ("Connection: close\r\n" if close else "")
            + "\r\n").encode()


@pytest.mark.parametrize("via", ["deliver", "jdeliver"])
@pytest.mark.parametrize("what", ["json", "big", "close"])
async def test_a_whole_response_leaves_as_uvicorn_would_write_it_in_one_call(what: str, via: str) -> None:
    """``deliver`` writes the same bytes as starlette through uvicorn's ASGI send, keep-alive and pipelining
    included, head and body in one call, for starlette's response and bastion's ``JsonResponse`` alike; a HEAD
    request takes the ASGI path and gets the same head."""
    WHOLE.clear()
    async with serve() as (port, writes):
        fast = await _exchange(port, [_req("GET", f"/{via}/{what}"), _req("GET", "/json", close=True)])
        fast_writes = list(writes)
        writes.clear()
        slow = await _exchange(port, [_req("GET", f"/asgi/{what}"), _req("GET", "/json", close=True)])
        head = await _exchange(port, [_req("HEAD", f"/{via}/{what}", close=True)])
    assert fast == slow
    assert fast.startswith(b"HTTP/1.1 201 Created\r\n")
    if what == "close":  # the response closed the connection: the pipelined request behind it is not answered
        assert fast.count(b"HTTP/1.1") == 1 and b"connection: close\r\n" in fast
    else:
        assert fast.count(b"HTTP/1.1") == 2 and b"mcp-session-id: abc\r\n" in fast
    assert fast_writes[0] == fast[:len(fast_writes[0])] and fast_writes[0].endswith(BIG if what == "big" else b"}")
    assert head == slow.split(b"\r\n\r\n")[0] + (b"\r\nconnection: close" if what != "close" else b"") + b"\r\n\r\n"
    assert WHOLE == [True, False]  # the GET left whole; the HEAD took the ASGI path


BODY = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"' + b"y" * 3000 + b'"}}'


async def _post_body(port: int, head: bytes, pieces: list[bytes], pause: float = 0.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + (pieces[0] if pause == 0.0 else b""))
        for piece in pieces[1:] if pause == 0.0 else pieces:
            await writer.drain()
            await asyncio.sleep(pause)
            writer.write(piece)
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _answer(raw: bytes) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(raw.rsplit(b"\r\n\r\n", 1)[1])
    return parsed


def _chunked(data: bytes, size: int) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size]) for i in range(0, len(data), size)]
    return b"".join(parts) + b"0\r\n\r\n"


@pytest.mark.parametrize(("framing", "pause", "whole"), [
    ("length", 0.0, True),     # head and body in one segment: taken at once
    ("chunked", 0.0, True),    # a chunked body that is all here: taken at once, decoded
    ("length", 0.05, False),   # the body trickles in after the head: read through ASGI
    ("chunked", 0.05, False),
])
async def test_a_body_is_taken_whole_when_it_is_all_here_and_read_through_asgi_otherwise(
        framing: str, pause: float, whole: bool) -> None:
    wire = BODY if framing == "length" else _chunked(BODY, 700)
    coding = b"content-length: %d" % len(BODY) if framing == "length" else b"transfer-encoding: chunked"
    head = b"POST /body HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n%s\r\n\r\n" % coding
    pieces = [wire] if pause == 0.0 else [wire[i:i + 1000] for i in range(0, len(wire), 1000)]
    async with serve() as (port, _):
        raw = await _post_body(port, head, pieces, pause)
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    assert _answer(raw) == {"whole": whole, "sha": hashlib.sha256(BODY).hexdigest()}


async def test_a_whole_body_behind_expect_100_continue_gets_the_interim_answer_first() -> None:
    head = (b"POST /body HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\nexpect: 100-continue\r\n"
            b"content-length: %d\r\n\r\n" % len(BODY))
    async with serve() as (port, _):
        raw = await _post_body(port, head, [BODY])
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert _answer(raw) == {"whole": True, "sha": hashlib.sha256(BODY).hexdigest()}
