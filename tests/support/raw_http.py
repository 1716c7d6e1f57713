"""A raw HTTP/1.1 client over asyncio streams, for tests that must send what no HTTP library would (malformed,
duplicated, slow or truncated requests) and see exactly what came back; and the request reader the tests' hostile
upstream servers share (``read_request``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RawResponse:
    status: int | None  # None: the server closed (or stayed silent) without answering
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)


def build(method: str, target: str, headers: list[tuple[str, str]], body: bytes = b"", *,
          content_length: bool = True, version: str = "HTTP/1.1") -> bytes:
    lines = [f"{method} {target} {version}", *(f"{k}: {v}" for k, v in headers)]
    if content_length and body and not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body


async def _read_head(reader: asyncio.StreamReader) -> RawResponse:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return RawResponse(None)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
    return RawResponse(status, headers)


async def _read_body(reader: asyncio.StreamReader, out: RawResponse) -> None:
    status = out.status or 0
    length = out.header("content-length")
    with contextlib.suppress(asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        if length is not None:
            out.body = await reader.readexactly(int(length))
        elif (out.header("transfer-encoding") or "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunks.append(await reader.readexactly(size + 2))
                if size == 0:
                    break
            out.body = b"".join(c[:-2] for c in chunks)
        elif status not in (204, 304) and not 100 <= status < 200:
            out.body = await reader.read()


async def exchange(port: int, *parts: bytes, pause: float = 0.0, timeout: float = 10.0,
                   host: str = "127.0.0.1") -> RawResponse:
    """Send the parts (pausing between them) on a new connection and read one response (or the close)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for i, part in enumerate(parts):
            if i and pause:
                await asyncio.sleep(pause)
            writer.write(part)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            out = await asyncio.wait_for(_read_head(reader), timeout)
        except TimeoutError:
            return RawResponse(None)
        if out.status is not None:
            # A stream (SSE) may never end: what arrived by the deadline is the body.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_read_body(reader, out), max(0.0, deadline - loop.time()))
        return out
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    """One request as a test's raw upstream server reads it: method, target, headers (lower-case names, the last
    copy of each) and the body its ``Content-Length`` declares. Raises ``asyncio.IncompleteReadError`` at the end
    of the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    line, *fields = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    method, target, _ = line.split(" ", 2)
    return method, target, headers, body
