"""A small HTTP/1.1 keep-alive client for the hot path: one POST with a JSON body, to one upstream's origin.

httpx/httpcore's pool walks every pooled connection on each request and probes each idle socket with a system
call, so its cost per call grows with concurrency; that was most of the gateway's CPU per forwarded call. Here
an idle connection is popped from a LIFO stack per origin (O(1)), and a connection the server closed is noticed
for free: its protocol saw the FIN while it sat idle. The response head and body are parsed by ``httptools``
(llhttp) on an ``asyncio.Protocol``: Content-Length, chunked, or read-until-close bodies, gzip/deflate decoded
within the upstream's message-size limit (``bodies``).

A response head comes from the upstream, so it is bounded as it arrives, like a body (``bodies.MAX_HEAD_BYTES``,
``MAX_HEAD_LINES``, ``MAX_INTERIM``): its header lines counted in bytes and lines, interim (1xx) answers in
number, and the bytes read without a byte of body (an unfinished head, which httptools would otherwise buffer
by repeated concatenation, a chunk extension, trailers) in bytes. Past any of them the request fails and the
connection is dropped. Repeated header lines are collected and joined once. Trailers count against the head's
bounds and are not kept.

A connection goes back to the stack only when its response was read to the end and allowed keep-alive;
anything else (an early exit, an error, a cancelled caller) closes it, which is also how a streamed request is
cancelled. No redirects are followed, no proxy is used (``eligible`` says when that matters), and there is no
read timeout: the caller's own deadline governs, as for long SSE answers.

A request on a reused connection that dies before any response byte arrived is sent once more on a new
connection: that is the keep-alive race with a server closing an idle connection, in which the server never
read the request.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

import httptools

from bastion.errors import UpstreamUnavailable
from bastion.upstream.bodies import (
    ACCEPT_ENCODING,
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_HEAD_BYTES,
    MAX_HEAD_LINES,
    MAX_INTERIM,
    ContentDecoder,
    decoded,
    read_limited,
    too_large,
)

__all__ = ["H1Pool", "H1Response", "Target", "eligible"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
# A header value or name with these would split the request; they only come from config or a server's answer.
_UNSAFE = re.compile(r"[\r\n\x00]")
# Past this much unread body, stop reading the socket until the consumer catches up (long SSE answers).
_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024
# Encoded header blocks kept per pool (a session's headers repeat on every POST); past this many, start over.
_HEAD_CACHE = 64


@dataclass(frozen=True, slots=True)
class Target:
    """One URL, parsed once: where to connect and what to put in the request line and Host header."""

    scheme: str
    host: str
    port: int
    path: str
    host_header: str

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port

    @classmethod
    def from_url(cls, url: str) -> Target:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = parts.hostname or ""
        port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
        if scheme not in _DEFAULT_PORTS or not host or _UNSAFE.search(url) or " " in url:
            raise ValueError("not an absolute http(s) URL")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        shown = f"[{host}]" if ":" in host else host
        host_header = shown if port == _DEFAULT_PORTS[scheme] else f"{shown}:{port}"
        return cls(scheme, host, port, path, host_header)

    @classmethod
    def parse(cls, url: str) -> Target | None:
        try:
            return cls.from_url(url)
        except ValueError:
            return None


def eligible(url: str) -> bool:
    """Whether ``H1Pool`` reaches ``url`` as httpx would: a plain http(s) URL without credentials in it, and no
    proxy from the environment (``HTTP_PROXY`` and friends, which httpx honours) applies to its host."""
    try:
        target = Target.from_url(url)
        parts = urlsplit(url)
    except ValueError:
        return False
    if parts.username is not None or parts.password is not None:
        return False
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get(target.scheme) or proxies.get("all")):
        return True
    return bool(urllib.request.proxy_bypass(target.host))


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the answer passed one of the head's bounds (``failure`` says which)."""


class _Dead(Exception):
    """The connection ended (or failed) before any byte of the response arrived."""


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the response currently being read from it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.failure: str | None = None
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._read_paused = False
        self.reset()

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.active = False
        self.received = False
        self.status = 0
        self.headers: dict[str, str] = {}
        # Values of a header name seen more than once, joined into ``headers`` once the head is complete.
        self._repeated: dict[str, list[str]] | None = None
        # The head's budget, for the whole exchange (interim answers and trailers draw on it too).
        self._head_room = MAX_HEAD_BYTES
        self._head_lines = MAX_HEAD_LINES
        self._interim = 0
        # Bytes fed since the last byte of body (or the request): an unfinished head, chunk framing, trailers.
        self._no_body = 0
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0

    # -- asyncio.Protocol ------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.active:
            # Bytes on an idle connection are no answer to anything; the connection can no longer be trusted.
            self.close()
            return
        self.received = True
        buffered = self.buffered
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools' parse and callback errors (a bound passed: ``failure`` says which)
            if self.failure is None:
                self.failure = f"malformed HTTP response: {type(exc).__name__}: {exc}"
            self.close()
        else:
            if self.buffered != buffered or self.complete:
                self._no_body = 0
            else:
                # No body came of these bytes: httptools holds what it has of an unfinished header line, and
                # appends to it on every feed, so this is what bounds its memory and its copying.
                self._no_body += len(data)
                if self._no_body > MAX_HEAD_BYTES:
                    self.failure = (f"{MAX_HEAD_BYTES} bytes of chunk framing or trailers without a body byte"
                                    if self.head_done else f"response head over {MAX_HEAD_BYTES} bytes")
                    self.close()
        self._wake()

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if exc is not None and self.failure is None:
            self.failure = f"{type(exc).__name__}: {exc}"
        if self.head_done and not self.complete and self._until_close():
            self.complete = True
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- httptools callbacks ---------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_lines -= 1
        self._head_room -= len(name) + len(value)
        if self._head_lines < 0 or self._head_room < 0:
            what = "response trailers and head" if self.head_done else "response head"
            self.failure = (f"{what} over {MAX_HEAD_LINES} header lines" if self._head_lines < 0
                            else f"{what} over {MAX_HEAD_BYTES} bytes of header lines")
            raise _HeadTooLarge()
        if self.head_done:
            return  # a trailer: counted against the head's bounds above, and not kept
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self.headers
        if key not in headers:
            headers[key] = text
            return
        # Joined once, when the head is complete: joining on every repeat would copy the value each time.
        repeated = self._repeated
        if repeated is None:
            repeated = self._repeated = {}
        values = repeated.get(key)
        if values is None:
            repeated[key] = [headers[key], text]
        else:
            values.append(text)

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            # An interim answer (103 Early Hints); the real one follows. Its lines stay counted.
            self.headers = {}
            self._repeated = None
            self._interim += 1
            if self._interim > MAX_INTERIM:
                self.failure = f"more than {MAX_INTERIM} interim (1xx) responses"
                raise _HeadTooLarge()
            return
        if self._repeated is not None:
            for key, values in self._repeated.items():
                self.headers[key] = ", ".join(values)
            self._repeated = None
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True

    # -- used by the pool ------------------------------------------------------------------------------------

    def _until_close(self) -> bool:
        return ("content-length" not in self.headers and "transfer-encoding" not in self.headers
                and self.status not in (204, 304))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        await self._waiter

    async def send(self, data: bytes, write_timeout: float) -> None:
        assert self.transport is not None
        self.active = True
        self.transport.write(data)
        if self._write_paused and not self.lost:
            self._drained = self._loop.create_future()
            try:
                async with asyncio.timeout(write_timeout):
                    await self._drained
            except TimeoutError:
                self.failure = "request write timed out"
                self.close()
            finally:
                self._drained = None

    async def read_head(self) -> None:
        while not self.head_done:
            if self.lost or self.failure is not None:
                raise _Dead() if not self.received else self._broken("no complete response head")
            await self._wait()
        if self.failure is not None:
            raise self._broken("malformed HTTP response")

    async def next_chunk(self) -> bytes | None:
        """The next piece of body, or ``None`` at its end."""
        while not self.chunks:
            if self.complete:
                return None
            if self.lost or self.failure is not None:
                raise self._broken("connection closed in the response body")
            await self._wait()
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self._read_paused and self.buffered < _LOW_WATER and self.transport is not None and not self.lost:
            self._read_paused = False
            self.transport.resume_reading()
        return chunk

    def reusable(self) -> bool:
        return (self.complete and self.keep_alive and not self.lost and self.failure is None and not self.chunks
                and not self._read_paused)

    def _broken(self, what: str) -> _Broken:
        return _Broken(f"{what}: {self.failure}" if self.failure else what)

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.close()
        self.lost = True


class _Broken(Exception):
    """The connection failed after the response began."""


class H1Response:
    """The head of one answer, and its body to read once: whole (``aread``), as it arrives (``aiter_bytes``), or
    as it came over the wire (``aiter_raw``, still content-encoded). Header names are lower case. Decoding is
    bounded as ``bodies`` describes: ``aread`` refuses a body over its ``limit``, ``aiter_bytes`` yields pieces of
    at most ``bodies.PIECE`` bytes."""

    __slots__ = ("_conn", "_decoder", "_name", "headers", "status_code")

    def __init__(self, name: str, conn: _Connection) -> None:
        self._name = name
        self._conn = conn
        self.status_code = conn.status
        self.headers: Mapping[str, str] = conn.headers
        self._decoder = ContentDecoder.for_headers(name, conn.headers)

    async def aread(self, limit: int = DEFAULT_MAX_MESSAGE_BYTES) -> bytes:
        conn = self._conn
        if self._decoder is None and conn.complete and len(conn.chunks) <= 1:
            # The common case: the whole answer arrived with its head.
            body = conn.chunks.popleft() if conn.chunks else b""
            conn.buffered = 0
            if len(body) > limit:
                raise too_large(self._name, limit)
            return body
        return await read_limited(self._name, self.aiter_raw(), self._decoder, limit)

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        return decoded(self.aiter_raw(), self._decoder)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while True:
            try:
                chunk = await self._conn.next_chunk()
            except _Broken as exc:
                raise UpstreamUnavailable(self._name, log_detail=str(exc)) from None
            if chunk is None:
                return
            yield chunk


class _Exchange:
    """``async with pool.post(...) as response``: the request is sent on enter, the connection released on exit."""

    __slots__ = ("_body", "_conn", "_headers", "_pool", "_target")

    def __init__(self, pool: H1Pool, target: Target, headers: Mapping[str, str], body: bytes) -> None:
        self._pool = pool
        self._target = target
        self._headers = headers
        self._body = body
        self._conn: _Connection | None = None

    async def __aenter__(self) -> H1Response:
        pool = self._pool
        message = pool.encode(self._target, self._headers, self._body)
        for attempt in (1, 2):
            conn = pool.take(self._target) if attempt == 1 else None
            reused = conn is not None
            if conn is None:
                conn = await pool.connect(self._target)
            self._conn = conn
            try:
                await conn.send(message, pool.write_timeout)
                await conn.read_head()
                return H1Response(pool.name, conn)
            except _Dead:
                conn.close()
                self._conn = None
                if not reused:
                    raise UpstreamUnavailable(pool.name, log_detail=f"POST: connection closed before an answer"
                                              f" ({conn.failure or 'no detail'})") from None
            except _Broken as exc:
                conn.close()
                self._conn = None
                raise UpstreamUnavailable(pool.name, log_detail=f"POST: {exc}") from None
            except BaseException:
                conn.close()
                self._conn = None
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if exc is not None:
            # Whatever failed (a body over the size limit, an undecodable or malformed answer), the connection's
            # state is no longer trusted, even if its response happened to be read to the end.
            conn.close()
        self._pool.give_back(self._target, conn)


class H1Pool:
    """Keep-alive HTTP/1.1 connections for one upstream, at most ``max_idle`` idle ones per origin.

    Every failure is raised as ``UpstreamUnavailable(name)`` with the detail for the log only.
    """

    def __init__(self, name: str, *, max_idle: int = 64, idle_expiry: float = 4.0, connect_timeout: float = 10.0,
                 write_timeout: float = 30.0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.name = name
        self.max_idle = max_idle
        self.idle_expiry = idle_expiry
        self.connect_timeout = connect_timeout
        self.write_timeout = write_timeout
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._closed = False
        # (target, headers) -> the request head up to Content-Length's value, checked and encoded once.
        self._heads: dict[tuple[Target, tuple[tuple[str, str], ...]], tuple[bytes, bytes]] = {}

    def post(self, target: Target, headers: Mapping[str, str], body: bytes) -> _Exchange:
        """One POST; use as ``async with pool.post(target, headers, body) as response``. ``headers`` should not
        carry Host, Content-Length, Transfer-Encoding or Connection: the pool writes those."""
        return _Exchange(self, target, headers, body)

    def encode(self, target: Target, headers: Mapping[str, str], body: bytes) -> bytes:
        key = (target, tuple(headers.items()))
        parts = self._heads.get(key)
        if parts is None:
            parts = self._encode_head(target, headers)
            if len(self._heads) >= _HEAD_CACHE:
                self._heads.clear()
            self._heads[key] = parts
        before, after = parts
        return b"%s%d%s%s" % (before, len(body), after, body)

    def _encode_head(self, target: Target, headers: Mapping[str, str]) -> tuple[bytes, bytes]:
        """The head around Content-Length's value: what comes before it and what follows, up to the body."""
        lines = [f"POST {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\nAccept-Encoding: {ACCEPT_ENCODING}"
                 f"\r\nContent-Length: \x00"]
        for name, value in headers.items():
            if _UNSAFE.search(name) or _UNSAFE.search(value) or ":" in name:
                raise UpstreamUnavailable(self.name, log_detail=f"header {name[:64]!r} has a forbidden character")
            lines.append(f"{name}: {value}")
        lines.append("\r\n")
        try:
            head = "\r\n".join(lines).encode("latin-1")
        except UnicodeEncodeError:
            raise UpstreamUnavailable(self.name, log_detail="a request header is not latin-1") from None
        # The placeholder cannot come from a header: _UNSAFE refuses NUL in names and values.
        before, _, after = head.partition(b"\x00")
        return before, after

    def take(self, target: Target) -> _Connection | None:
        stack = self._idle.get(target.origin)
        if not stack:
            return None
        now = time.monotonic()
        while stack:
            conn = stack.pop()
            if not conn.lost and now - conn.idle_since < self.idle_expiry:
                return conn
            conn.close()
        return None

    def give_back(self, target: Target, conn: _Connection) -> None:
        if self._closed or not conn.reusable():
            conn.close()
            return
        stack = self._idle.setdefault(target.origin, [])
        now = time.monotonic()
        # LIFO leaves the least recently used at the bottom; drop it there once it expired or died.
        if stack and (stack[0].lost or now - stack[0].idle_since >= self.idle_expiry):
            stack.pop(0).close()
        if len(stack) >= self.max_idle:
            conn.close()
            return
        conn.reset()
        conn.idle_since = now
        stack.append(conn)

    async def connect(self, target: Target) -> _Connection:
        if self._closed:
            raise UpstreamUnavailable(self.name, log_detail="client closed")
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if target.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(loop), target.host, target.port, ssl=tls,
                                                       server_hostname=target.host if tls is not None else None)
        except TimeoutError:
            raise UpstreamUnavailable(self.name, log_detail="connect timed out") from None
        except OSError as exc:  # refused, unreachable, DNS (socket.gaierror), TLS (ssl.SSLError)
            raise UpstreamUnavailable(self.name, log_detail=f"connect: {type(exc).__name__}: {exc}") from None
        return conn

    def idle_count(self) -> int:
        return sum(len(stack) for stack in self._idle.values())

    def reopen(self) -> None:
        """Connect again after ``aclose``: its owner was closed and is starting again (see ``AutoHttpUpstream``)."""
        self._closed = False

    async def aclose(self) -> None:
        self._closed = True
        stacks, self._idle = self._idle, {}
        for stack in stacks.values():
            for conn in stack:
                conn.close()
