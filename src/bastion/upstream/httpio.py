"""What the HTTP transports share: the httpx client they are given (``upstream_client``), the httpx error boundary,
bounded reading of bodies and SSE over a response, origin checks, timeouts."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from http.cookiejar import Cookie, CookieJar
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import orjson

from bastion.errors import UpstreamUnavailable
from bastion.sse import SseDecoder, SseEvent, SseEventTooLarge
from bastion.tracing.traceparent import parse_traceparent
from bastion.upstream.base import UpstreamInfo
from bastion.upstream.bodies import (
    ACCEPT_ENCODING,
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_HEAD_BYTES,
    MAX_HEAD_LINES,
    ContentDecoder,
    decoded,
    read_limited,
    too_large,
)
from bastion.upstream.connections import H1Pool, H1Response, Target

__all__ = ["HTTPX_HEADERS", "STREAM_TIMEOUT", "ResponseLike", "http_errors", "is_event_stream", "read_body",
           "same_origin", "sse_events", "trace_headers", "upstream_client"]

# Our own asyncio deadline governs each request; httpx's read timeout would cut long SSE streams that are merely
# quiet (a slow tool between progress events), so only connecting and writing are bounded here.
STREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=10.0)
# Added to every request sent through httpx: bodies are decoded by ``bodies.ContentDecoder``, not by httpx (whose
# decoding has no bound), so only its codings may be asked for, whatever httpx would offer with brotli installed.
HTTPX_HEADERS = {"Accept-Encoding": ACCEPT_ENCODING}

_DEFAULT_PORTS = {"http": 80, "https": 443}
# W3C Trace Context caps tracestate at 32 members of at most 256 characters; a field value is visible ASCII.
_MAX_TRACESTATE = 8192
_FIELD_VALUE = re.compile(r"^[\x20-\x7e]*$")


class _NoCookies(CookieJar):
    """A cookie jar that keeps nothing. One httpx client serves every upstream (and the JWKS fetch), and a cookie
    ignores ports: kept, a cookie one upstream set would go to every other upstream on the same host. MCP does not
    use cookies (a session is ``Mcp-Session-Id``), and the lean pool never sent any."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: Cookie) -> None:
        return None


async def _bounded_head(response: httpx.Response) -> None:
    """The head bounds ``connections`` applies, for answers read by httpx. h11 has already bounded what it buffers
    of an unfinished head (httpcore's 100 KiB); this holds every answer to the same numbers as the lean pool.
    Raising here makes httpx close the response unread, which drops its connection."""
    raw = response.headers.raw
    if len(raw) > MAX_HEAD_LINES:
        raise httpx.RemoteProtocolError(f"response head over {MAX_HEAD_LINES} header lines", request=response.request)
    if sum(len(name) + len(value) for name, value in raw) > MAX_HEAD_BYTES:
        raise httpx.RemoteProtocolError(f"response head over {MAX_HEAD_BYTES} bytes of header lines",
                                        request=response.request)


def upstream_client() -> httpx.AsyncClient:
    """The httpx client the HTTP upstreams share (GET streams, DELETE, the HTTP+SSE transport, POSTs under
    ``http_client: httpx``), also used to fetch JWKS. Nothing one upstream's answers leave in it reaches another:
    cookies are never kept, redirects are not followed (a redirect is an answer like any other, refused as an
    error by the transports), no authentication is attached but what a request's own URL carries. Every answer's
    head is bounded as ``bodies.MAX_HEAD_BYTES`` and ``MAX_HEAD_LINES`` say. Proxies from the environment
    (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``) apply, as ``connections.eligible`` expects."""
    return httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0),
                             limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
                             follow_redirects=False, cookies=_NoCookies(),
                             event_hooks={"response": [_bounded_head]})


class ResponseLike(Protocol):
    """What the transports read from an answer, whether httpx's ``Response`` or ``connections.H1Response``. Header
    lookups use lower-case names, which both serve."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...


class http_errors:  # a function in use: ``with http_errors(name, "POST"):``
    """Map httpx (and malformed JSON) failures to ``UpstreamUnavailable``; the detail goes to the log only.

    A class rather than a ``@contextmanager`` generator: it wraps every POST, and a generator costs several
    times more to enter and leave."""

    __slots__ = ("_upstream", "_what")

    def __init__(self, upstream: str, what: str) -> None:
        self._upstream = upstream
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, httpx.HTTPError | httpx.StreamError | httpx.InvalidURL):
            raise UpstreamUnavailable(self._upstream, log_detail=f"{self._what}: {type(exc).__name__}: {exc}"
                                      ) from None
        if isinstance(exc, orjson.JSONDecodeError):
            raise UpstreamUnavailable(self._upstream, log_detail=f"{self._what}: malformed JSON: {exc}") from None


async def _read(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _raw(response: ResponseLike, upstream: str) -> tuple[AsyncIterator[bytes], ContentDecoder | None]:
    """The body as it came (and the decoder it needs), or, from an httpx response that was already read when it
    was made (a mock transport's), that decoded body: httpx then has nothing left to stream."""
    if isinstance(response, httpx.Response) and response.is_stream_consumed:
        return _read(response.content), None
    return response.aiter_raw(), ContentDecoder.for_headers(upstream, response.headers)


async def read_body(response: ResponseLike, upstream: str, limit: int) -> bytes:
    """The whole body, content-decoded, refused with ``UpstreamUnavailable`` as soon as it passes ``limit`` bytes
    (the upstream's ``max_message_size``). Every body an HTTP upstream sends is read here or by ``sse_events``."""
    if type(response) is H1Response:
        return await response.aread(limit)
    raw, decoder = _raw(response, upstream)
    return await read_limited(upstream, raw, decoder, limit)


async def sse_events(response: ResponseLike, upstream: str, decoder: SseDecoder) -> AsyncIterator[SseEvent]:
    """The events of an SSE body; ``decoder`` (made with the upstream's ``max_message_size`` as its
    ``max_event_bytes``) refuses an event over it, raised here as ``UpstreamUnavailable``."""
    pieces = response.aiter_bytes() if type(response) is H1Response else decoded(*_raw(response, upstream))
    try:
        async for piece in pieces:
            for event in decoder.feed(piece):
                yield event
    except SseEventTooLarge:
        raise too_large(upstream, decoder.max_event_bytes or 0, "SSE event") from None
    except ValueError as exc:
        # Whatever else the upstream's bytes make the decoder refuse ends the stream, as an unavailable upstream
        # (which every reader handles), never as an error its reader does not expect.
        raise UpstreamUnavailable(upstream, log_detail=f"unreadable SSE stream: {exc}") from None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def same_origin(a: str, b: str) -> bool:
    try:
        return _origin(a) == _origin(b)
    except ValueError:
        # urlsplit rejects some malformed ports and hosts; such a URL is never our origin.
        return False


def trace_headers(message: Mapping[str, Any]) -> dict[str, str]:
    """The W3C ``traceparent``/``tracestate`` headers mirroring a request's ``params._meta`` trace context.

    ``_meta`` is the MCP way to carry trace context (it reaches stdio servers too); HTTP servers and proxies that
    trace at the HTTP layer read the headers. Only a well-formed ``traceparent`` is mirrored (a client's value
    passes through when bastion does not trace), and ``tracestate`` only with it, never with a CR or LF.
    """
    # dict, not Mapping: an ABC isinstance costs more than the rest of this function, which runs on every POST.
    params = message.get("params")
    meta = params.get("_meta") if type(params) is dict else None
    if type(meta) is not dict:
        return {}
    parent = meta.get("traceparent")
    # A later version's traceparent may carry more fields: still only visible ASCII goes on the wire.
    if not isinstance(parent, str) or parse_traceparent(parent) is None or not _FIELD_VALUE.match(parent):
        return {}
    out = {"traceparent": parent.strip()}
    state = meta.get("tracestate")
    if isinstance(state, str) and state and len(state) <= _MAX_TRACESTATE and _FIELD_VALUE.match(state):
        out["tracestate"] = state.strip()
    return out


def is_event_stream(response: ResponseLike) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.lower().startswith("text/event-stream")


class HttpPeer:
    """What both Streamable HTTP transports (handshake era and 2026-07-28) hold about their server: where it is,
    which client carries which requests, and the headers every POST starts from."""

    def __init__(self, name: str, url: str, headers: Mapping[str, str], client: httpx.AsyncClient, *,
                 init_timeout: float, listen: bool, fast: H1Pool | None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.name = name
        # The most one message may take once decoded: a JSON body, an error body, an SSE event.
        self._max_message = max_message_bytes
        self._url = url
        self._client = client
        # POSTs go through the lean keep-alive pool when there is one; httpx keeps the long-lived streams.
        self._fast = fast
        self._target = Target.parse(url) if fast is not None else None
        self._init_timeout = init_timeout
        self._listen_enabled = listen
        self._base_headers = {**headers, "Accept": "application/json, text/event-stream",
                              "Content-Type": "application/json"}
        self._info: UpstreamInfo | None = None
        self._closed = False

    @property
    def info(self) -> UpstreamInfo | None:
        return self._info
