"""The HTTP/1.1 protocol under the app: uvicorn's httptools protocol plus the limits it lacks.

uvicorn with httptools (llhttp) parses HTTP well but enforces no size or time limit on what a client sends before
the app runs: a header section can grow without bound (and is re-buffered as it grows), a request line too, a
connection may trickle one byte every few seconds forever (slowloris), and a transfer coding llhttp frames as
chunked (``gzip, chunked``) reaches the app with a body it would misread. Its keep-alive timeout only starts after
a response, and an unknown method or a parse error gets a plain-text 400. (h11, uvicorn's other parser, bounds the
header section with ``h11_max_incomplete_event_size`` but answers every violation with 400 and costs about twice
the CPU.) This module closes those gaps where they arise, in the parser callbacks, as the edge proxies do:

===================================  =========================================  ==================================
what                                 limit (``listen`` key)                     answer
===================================  =========================================  ==================================
request target                       ``max_target_size`` (8 KiB)                414, connection closed
header section, request line incl.   ``max_header_size`` (16 KiB)               431, connection closed
header lines                         ``max_headers`` (100)                      431, connection closed
transfer coding other than chunked   (none)                                     501, connection closed
transfer coding in HTTP/1.0          (none)                                     400, connection closed
method llhttp does not know          (none)                                     501, connection closed
anything else llhttp refuses         (none)                                     400, connection closed
head and body not in by deadline     ``request_timeout`` (10 s from 1st byte)   408 if nothing was answered yet,
                                                                                then closed
idle keep-alive connection           ``keep_alive_timeout`` (5 s, uvicorn's)    closed
===================================  =========================================  ==================================

Every refusal is reported (counted and audited, rate-limited) through ``FrontDoorOptions.report``. After an
error response the connection is half-closed and what the client still sends is read and dropped for a moment
("lingering close", as nginx does), so the client reads the answer instead of a connection reset.

One thing it changes on the way out: uvicorn writes a response's head and its body with one ``write`` each, that
is two ``send`` system calls and two TCP segments (asyncio sets ``TCP_NODELAY``) for every JSON answer. A response
that declares its length has its head held back and written together with its body (``_OneWriteCycle``): the same
bytes, one system call (a gathering one for a big body, which is then not copied). Streamed responses (no declared
length) keep uvicorn's order, so an SSE stream's head still leaves at once.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
import structlog
from starlette.responses import Response
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from bastion import jsonrpc
from bastion.errors import INVALID_REQUEST, Refused
from bastion.server.answer import JsonResponse
from bastion.server.checks import FRONT_LINES, FrontLines

__all__ = ["FrontDoorOptions", "FrontDoorProtocol", "deliver", "front_door_protocol", "on_lost", "whole_body"]

log = structlog.get_logger("bastion.http")

# Lingering close: after an error answer, drop what the client still sends for at most this long / this much.
LINGER_S = 2.0
LINGER_BYTES = 1024 * 1024
# llhttp's messages for transfer codings it cannot frame (httptools exposes no error numbers).
_TE_ERRORS = ("Request has invalid `Transfer-Encoding`", "Invalid `Transfer-Encoding` header value")

# From this body size on, a held head is sent with the body by a gathering write instead of being concatenated
# with it: copying a body costs more than gathering two buffers long before this size (a 650 KB tools/list page
# took 0.5 ms to concatenate, page faults included).
_GATHER_BYTES = 64 * 1024

# Responses that are only a status, headers and a body, which ``deliver`` may write itself.
_PLAIN: tuple[type[Response], ...] = (Response, JsonResponse)

# A request line's method: a token, then a space (RFC 9110 section 9.1, RFC 9112 section 3).
_METHOD = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64} ")

# (refusal, remote address, method, path, traceparent)
Report = Callable[[Refused, str | None, str | None, str | None, str | None], None]


@dataclass(frozen=True, slots=True)
class FrontDoorOptions:
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100
    max_target_bytes: int = 8 * 1024
    request_timeout_s: float = 10.0
    report: Report | None = None


class _Hold:
    """Stands in for the transport while uvicorn writes a response head, and keeps what it was given."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


class _Prefixed:
    """Stands in for the transport from a held head to the first write after it, which carries the head too.
    A ``close`` before any write (the app failed between head and body) still sends the head first, as uvicorn
    would have; everything else is passed through."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: asyncio.Transport, head: bytes) -> None:
        self.transport = transport
        self.head = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, b""
        if not head:
            self.transport.write(data)
        elif len(data) < _GATHER_BYTES:
            self.transport.write(head + data)
        else:
            # A big body is not copied behind its head: uvloop sends both with one writev (asyncio before 3.12
            # joins them, as the concatenation would).
            self.transport.writelines((head, data))

    def close(self) -> None:
        if self.head:
            self.write(b"")
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class _OneWriteCycle(RequestResponseCycle):
    """uvicorn's request/response cycle, writing a response of declared length with one ``write``.

    uvicorn's own ``send`` still does all the work (header checks, length accounting, keep-alive); only the
    transport it writes to is swapped, so its bookkeeping cannot drift from what it wrote.
    """

    # Called (once) if the connection is lost before the response starts; set per request by ``on_lost``.
    on_lost: Callable[[], None] | None = None

    async def send(self, message: Any) -> None:
        transport: Any = self.transport  # uvicorn's transport, or the stand-in holding a head back
        if isinstance(transport, _Prefixed):
            try:
                await super().send(message)
            finally:
                if not transport.head:  # written (with the body, or an empty body); else wait for the next write
                    self.transport = transport.transport
            return
        if self.response_started or message["type"] != "http.response.start":
            await super().send(message)
            return
        hold = _Hold()
        self.transport = hold  # type: ignore[assignment]  # all uvicorn's send uses of it is ``write``
        try:
            await super().send(message)
        finally:
            self.transport = transport
        if not hold.data:
            return  # disconnected: uvicorn wrote nothing either
        if self.chunked_encoding is False and self.scope["method"] != "HEAD":
            # A body of declared length follows (starlette's Response sends it next, with nothing in between).
            self.transport = _Prefixed(transport, hold.data)  # type: ignore[assignment]
        else:
            transport.write(hold.data)


    def take_body(self) -> bytes | None:
        """The whole request body, when it is all here: what ``receive`` returns as its one ``http.request``
        message (the same state changes: the 100-continue answer, reading resumed, the event cleared), without
        the message, the coroutine and starlette's stream around it. None, having done nothing, when more body is
        to come or the client is gone: the caller then reads through ASGI as usual."""
        if self.more_body or self.disconnected or self.response_complete or not self.message_event.is_set():
            return None
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        self.flow.resume_reading()
        self.message_event.clear()
        body = bytes(self.body)
        self.body = bytearray()
        return body

    def send_whole(self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> bool:
        """Write a whole response of declared length at once, without ASGI messages: what ``send`` does for a
        start and its one body message (the same checks, bytes and bookkeeping), in one call.

        Returns False, having done nothing, for anything off the common path (a response already started, a
        paused or lost connection, HEAD, no ``content-length``, a transfer coding, the access log on): the
        caller then sends through ASGI as usual.
        """
        if (self.response_started or self.disconnected or self.flow.write_paused or self.access_log
                or self.scope["method"] == "HEAD"):
            return False
        content = [STATUS_LINE[status]]
        keep_alive = self.keep_alive
        has_close = False
        length: int | None = None
        for name, value in itertools.chain(self.default_headers, headers):
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length":
                if length is None:
                    length = int(value.decode())
            elif name == b"transfer-encoding":
                return False
            elif name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
                keep_alive = False
                has_close = True
            content.extend((name, b": ", value, b"\r\n"))
        if length is None:
            return False
        if length != len(body):
            raise RuntimeError("Response content longer than Content-Length" if len(body) > length
                               else "Response content shorter than Content-Length")
        if not keep_alive and not has_close:
            content.append(b"connection: close\r\n")
        content.append(b"\r\n")
        self.response_started = True
        self.waiting_for_100_continue = False
        self.chunked_encoding = False
        self.expected_content_length = 0
        self.keep_alive = keep_alive
        if len(body) < _GATHER_BYTES:
            content.append(body)
            self.transport.write(b"".join(content))
        else:
            self.transport.writelines((b"".join(content), body))
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
        return True


def on_lost(receive: Receive, callback: Callable[[], None] | None) -> bool:
    """Have ``callback`` called, once and from the event loop, if the request's connection is lost before its
    response starts to leave (``FrontDoorProtocol.connection_lost``); ``None`` takes it back. A plain attribute
    set: no task and no await watch for the ``http.disconnect`` in the meantime.

    False, having done nothing, under another server: nothing then learns of the loss before the app next sends
    or receives."""
    cycle = getattr(receive, "__self__", None)
    if not isinstance(cycle, _OneWriteCycle):
        return False
    cycle.on_lost = callback
    return True


def whole_body(receive: Receive) -> bytes | None:
    """The request's whole body at once, when the server is bastion's and all of it has arrived
    (``_OneWriteCycle.take_body``); None otherwise (read it through ``receive``)."""
    cycle = getattr(receive, "__self__", None)
    return cycle.take_body() if isinstance(cycle, _OneWriteCycle) else None


async def deliver(response: Response, scope: AsgiScope, receive: Receive, send: Send) -> bool:
    """Send ``response``. A plain one (a JSON answer) leaves through bastion's protocol in one call when the
    server is bastion's (``_OneWriteCycle.send_whole``); anything else, or under another server, as ASGI. True
    when it left the first way."""
    cycle = getattr(send, "__self__", None)
    # Plain responses only (a JSON answer, starlette's or bastion's pre-encoded one): a subclass may render or send
    # differently.
    if type(response) in _PLAIN and response.background is None and isinstance(cycle, _OneWriteCycle):
        body = response.body
        if isinstance(body, bytes) and cycle.send_whole(response.status_code, response.raw_headers, body):
            return True
    await response(scope, receive, send)
    return False


class _Refusal(Exception):
    """A refusal raised out of a parser callback; httptools hands it back as the context of its own error."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.message)
        self.refused = refused


def front_door_protocol(options: FrontDoorOptions) -> type[FrontDoorProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, bound to these limits."""
    return type("BoundFrontDoorProtocol", (FrontDoorProtocol,), {"options": options})


class FrontDoorProtocol(HttpToolsProtocol):
    options: ClassVar[FrontDoorOptions] = FrontDoorOptions()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the bytes arriving now belong to a request head (or to the wait for one)
        self._head_bytes = 0  # raw bytes received for the current head, counted while it is incomplete
        self._heads_done = 0
        self._request_started = False  # a byte of the current request has been parsed
        self._header_count = 0
        self._header_bytes = 0  # exact: request target, names and values, plus 4 per line
        self._codings: list[bytes] = []
        self._front = FrontLines()
        # The connection's clock: when the request being received began (None while none is), when the
        # connection went idle after a response (None while it is not: the keep-alive wait), and one timer per
        # connection that checks both. uvicorn arms and cancels a keep-alive timer around every request, and
        # re-arming a timer per request costs more than the check (about 2 µs each under uvloop).
        self._since: float | None = None
        self._idle_since: float | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_at = 0.0  # event-loop time the timer is armed for
        self._lingering = -1  # bytes dropped since the error answer; -1 while not lingering
        self._max_headers = self.options.max_headers
        self._max_header_bytes = self.options.max_header_bytes

    # -- connection ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # The first request's clock starts with the connection: a client that connects and sends nothing is
        # closed like one that trickles its head.
        self._since = self.loop.time()
        self._arm(self.options.request_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        super().connection_lost(exc)
        if isinstance(cycle, _OneWriteCycle) and cycle.on_lost is not None and not cycle.response_started:
            self._lost(cycle, cycle.on_lost)

    @staticmethod
    def _lost(cycle: _OneWriteCycle, callback: Callable[[], None]) -> None:
        """Tell the app that its request's connection is gone before any of the answer left (``on_lost``)."""
        cycle.on_lost = None
        try:
            callback()
        except Exception:  # pragma: no cover - the callbacks are bastion's own and do not raise
            log.error("http.on_lost_failed", exc_info=True)

    def data_received(self, data: bytes) -> None:
        if self._lingering >= 0:
            self._lingering += len(data)
            if self._lingering > LINGER_BYTES:
                self.transport.close()
            return
        self._idle_since = None  # uvicorn's _unset_keepalive_if_required, on the connection's clock
        counting, heads_done = self._in_head, self._heads_done
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No protocol upgrade is served (``ws="none"``); the request is answered as plain HTTP/1.1, which
            # RFC 9110 section 7.8 allows. What follows on the connection is dropped by the paused parser.
            return
        except _Refusal as exc:  # pragma: no cover - httptools wraps callback exceptions; kept for safety
            self._refuse(exc.refused)
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            self._refuse(cause.refused if isinstance(cause, _Refusal) else self._parse_error(exc, data))
            return
        if counting and self._in_head and heads_done == self._heads_done:
            # Everything in this chunk belonged to the unfinished head. This also bounds what llhttp buffers for
            # a single enormous header line, which no callback sees until it ends.
            self._head_bytes += len(data)
            if self._head_bytes > self.options.max_header_bytes:
                self._refuse(Refused(431, "Request Header Fields Too Large", reason="header_too_large",
                                     log_detail=f"header section over {self.options.max_header_bytes} bytes"))

    def _unsupported_upgrade_warning(self) -> None:
        log.debug("http.upgrade_ignored")

    # -- parser callbacks ---------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._request_started:
            self._request_started = True
            if self._heads_done:  # the first request's clock started with the connection
                self._since = self.loop.time()
        self._header_count = 0
        self._header_bytes = 0
        self._codings = []
        # The lines as the MCP endpoint checks them, gathered here while each header passes anyway.
        self._front = FrontLines()
        self.scope[FRONT_LINES] = self._front  # type: ignore[literal-required]
        if self._deadline is None:
            self._arm(self.options.request_timeout_s)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.options.max_target_bytes:
            raise _Refusal(Refused(414, "URI Too Long", reason="uri_too_long",
                                   log_detail=f"request target over {self.options.max_target_bytes} bytes"))
        if self.url[:1] != b"/":
            # Not origin-form: an absolute-form target's authority is what the Host check judges (RFC 9112
            # section 3.2.2), and the scope keeps only the path. (llhttp may pass a target in pieces; the last
            # call leaves it whole.)
            self._front.target = self.url

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called for every header line of every request: the common path is two additions and two comparisons.
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4
        if self._header_count > self._max_headers or self._header_bytes + len(self.url) > self._max_header_bytes:
            self._header_limit()
        # uvicorn's own on_header, inlined: this runs for every header line, and a super() call per line
        # doubles the cost of the Python callbacks (bench/bench_front_door.py --protocol-only).
        name = name.lower()
        if name == b"transfer-encoding":
            self._transfer_coding(value)
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))
        self._front.add(name, value)

    def _header_limit(self) -> None:
        if self._header_count > self._max_headers:
            raise _Refusal(Refused(431, "Request Header Fields Too Large", reason="too_many_headers",
                                   log_detail=f"more than {self._max_headers} header lines"))
        raise _Refusal(Refused(431, "Request Header Fields Too Large", reason="header_too_large",
                               log_detail=f"header section over {self._max_header_bytes} bytes"))

    def _transfer_coding(self, value: bytes) -> None:
        """Only plain ``chunked`` frames a body bastion can read; any other coding (or chunked twice, or a list
        llhttp would frame by its last entry) is not implemented (501), and in HTTP/1.0 the header itself means
        faulty framing (RFC 9112 section 6.1: 400)."""
        if self.parser.get_http_version() == "1.0":
            raise _Refusal(Refused(400, "Bad Request: Transfer-Encoding in an HTTP/1.0 request",
                                   reason="transfer_encoding", log_detail="transfer-encoding in HTTP/1.0"))
        self._codings.extend(c.strip(b" \t").lower() for c in value.split(b","))
        if self._codings != [b"chunked"]:
            shown = b", ".join(self._codings).decode("latin-1")[:100]
            raise _Refusal(Refused(501, "Not Implemented: only the chunked transfer coding is supported",
                                   reason="transfer_encoding", log_detail=f"transfer-encoding={shown}"))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_done += 1
        previous = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not previous and cycle is not None and type(cycle) is RequestResponseCycle:
            # Before its task first runs (it only reads ``self.send`` then): one write per answer, see above.
            cycle.__class__ = _OneWriteCycle
        if self.pipeline:
            # Queued behind a response still being written; bastion stopped reading, so the clock is not the
            # client's to beat.
            self._since = None

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0
        self._request_started = False
        self._since = None

    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive wait on the connection's clock instead of a timer per response.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        now = self.loop.time()
        self._idle_since = now
        expires = now + self.timeout_keep_alive
        if self._deadline is None or self._deadline_at > expires:
            self._arm(self.timeout_keep_alive)

    # -- refusals -----------------------------------------------------------------------------------------

    def _parse_error(self, exc: httptools.HttpParserError, data: bytes) -> Refused:
        text = str(exc)
        if isinstance(exc, httptools.HttpParserInvalidMethodError) and _METHOD.match(data.lstrip(b"\r\n")):
            # A well-formed method bastion does not implement (RFC 9110 section 9.1: 501); bytes that are not
            # HTTP at all (a TLS handshake, say) fall through to 400.
            return Refused(501, "Not Implemented: unknown method", reason="method", log_detail=text[:200])
        if text in _TE_ERRORS:
            return Refused(501, "Not Implemented: only the chunked transfer coding is supported",
                           reason="transfer_encoding", log_detail=text[:200])
        return Refused(400, "Bad Request: malformed HTTP request", reason="malformed", log_detail=text[:200])

    def _refuse(self, refused: Refused) -> None:
        """Answer (when the connection is free to carry an answer), report, and close."""
        self._disarm()
        if self.transport.is_closing() or self._lingering >= 0:
            return
        self._report(refused)
        cycle = self.cycle
        if self._in_head:
            # The refused request has no cycle; an earlier one may still be writing its response (pipelining),
            # and an answer now would land inside it.
            if cycle is not None and not cycle.response_complete:
                self.transport.close()
                return
        elif cycle is not None:
            if cycle.response_started:
                self.transport.close()
                return
            # The app may be waiting for the rest of the body: it sees a disconnect, and whatever it sends
            # afterwards is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self._answer(refused)

    def _answer(self, refused: Refused) -> None:
        body = jsonrpc.dumps(jsonrpc.error_body(refused.code if refused.code is not None else INVALID_REQUEST,
                                                refused.message, None))
        head = [STATUS_LINE[refused.status]]
        head.extend(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers)
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                    % len(body))
        self.transport.write(b"".join(head) + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._lingering = 0
            self.loop.call_later(LINGER_S, self._close)
        else:
            self.transport.close()

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _report(self, refused: Refused) -> None:
        report = self.options.report
        if report is None:
            return
        method: str | None = None
        path: str | None = None
        if self._request_started and self.url:
            # The target is parsed after the method, so a method is known (not the parser's zero default).
            method = self.parser.get_method().decode("latin-1")
            path = self.url[:256].decode("latin-1")
        report(refused, self.client[0] if self.client else None, method, path, None)

    # -- request deadline ---------------------------------------------------------------------------------

    def _arm(self, delay: float) -> None:
        self._disarm()
        self._deadline_at = self.loop.time() + delay
        self._deadline = self.loop.call_later(delay, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        idle_left = math.inf
        if self._idle_since is not None:
            idle_left = self._idle_since + self.timeout_keep_alive - now
            if idle_left <= 0:
                self.timeout_keep_alive_handler()
                return
        if self._since is None:
            # No request being received: the next one re-arms the timer, or the keep-alive wait does.
            if idle_left < math.inf:
                self._arm(idle_left)
            return
        remaining = self._since + self.options.request_timeout_s - now
        if remaining > 0:  # a later request than the one the timer was armed for
            self._arm(min(remaining, idle_left))
            return
        if self._in_head and not self._request_started:
            # Connected and silent: there is no request to answer.
            self._report(Refused(408, "Request Timeout", reason="request_timeout",
                                 log_detail="no request within the request timeout"))
            self.transport.close()
            return
        self._refuse(Refused(408, "Request Timeout", reason="request_timeout",
                             log_detail=f"request not received within {self.options.request_timeout_s:g} s"))
