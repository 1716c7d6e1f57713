"""Reading what an HTTP upstream sends within its message-size limit (``max_message_size``), whatever the client.

Every message is measured after content decoding and while it is read, never once it is buffered: a 1 MB gzip
answer can decode to 1 GiB, so a decoder is never asked for more than the limit still allows (``zlib``'s
``max_length``), and a body is refused as soon as it passes the limit. A whole body (a JSON answer, an error
body) counts against the limit; on an SSE stream each event does (see ``bastion.sse.SseDecoder``), and its body
is decoded in pieces of at most ``PIECE`` bytes. Both the lean pool's responses (``connections.H1Response``) and
httpx's are read from their raw, still encoded bytes (``aiter_raw``) through the same ``ContentDecoder``: httpx's
own decoding has no bound.

Over the limit, reading raises ``UpstreamUnavailable`` with the reason in its log detail; the caller leaves the
response, which drops its connection (its body was not read to the end, or the exchange failed).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterator, Mapping

from bastion.errors import UpstreamUnavailable

__all__ = ["ACCEPT_ENCODING", "DEFAULT_MAX_MESSAGE_BYTES", "MAX_HEAD_BYTES", "MAX_HEAD_LINES", "MAX_INTERIM", "PIECE",
           "ContentDecoder", "decoded", "read_limited", "too_large"]

# One JSON-RPC message from an upstream, on any transport: a stdio line, an HTTP body, an SSE event.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# RFC 9110: with no Accept-Encoding any coding is acceptable, so say what ``ContentDecoder`` decodes.
ACCEPT_ENCODING = "gzip, deflate"
# A response head from an HTTP upstream, whichever client reads it: its header lines (names and values) in bytes
# and in number, interim (1xx) answers and trailers included, and how many interim answers may precede the final
# one. Far above what a server sends (a few hundred bytes, a dozen lines, at most an Early Hints), low enough
# that parsing a head is cheap. Constants, not settings: no legitimate MCP server comes near them.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEAD_LINES = 100
MAX_INTERIM = 10
# The most one step of decoding a stream produces; also the most an SSE decoder is fed at once.
PIECE = 256 * 1024


def too_large(upstream: str, limit: int, what: str = "response body") -> UpstreamUnavailable:
    return UpstreamUnavailable(upstream, log_detail=f"{what} exceeds max_message_size ({limit} bytes after content"
                                                    f" decoding); connection dropped")


def _undecodable(upstream: str, exc: zlib.error) -> UpstreamUnavailable:
    return UpstreamUnavailable(upstream, log_detail=f"undecodable response body: {exc}")


class ContentDecoder:
    """Undoes one response's ``Content-Encoding`` (gzip or deflate), never producing more than it is asked for."""

    __slots__ = ("_upstream", "_z")

    def __init__(self, upstream: str, z: zlib._Decompress) -> None:
        self._upstream = upstream
        self._z = z

    @classmethod
    def for_headers(cls, upstream: str, headers: Mapping[str, str]) -> ContentDecoder | None:
        """The decoder a response needs, ``None`` for an unencoded one. ``headers`` is looked up in lower case."""
        coding = headers.get("content-encoding")
        if coding is None:
            return None
        coding = coding.strip().lower()
        if coding in ("gzip", "x-gzip"):
            return cls(upstream, zlib.decompressobj(wbits=zlib.MAX_WBITS | 16))
        if coding == "deflate":
            return cls(upstream, zlib.decompressobj())
        if coding in ("identity", ""):
            return None
        raise UpstreamUnavailable(upstream, log_detail=f"unsupported content-encoding {coding[:64]!r}")

    def decode(self, data: bytes, max_length: int) -> bytes:
        """At most ``max_length`` (> 0) bytes decoded from ``data``; more than ``max_length - 1`` means there may be
        more, which ``pieces`` fetches and ``read_limited`` refuses."""
        try:
            return self._z.decompress(data, max_length)
        except zlib.error as exc:
            raise _undecodable(self._upstream, exc) from None

    def pieces(self, data: bytes, size: int = PIECE) -> Iterator[bytes]:
        """All of ``data`` decoded, in pieces of at most ``size`` bytes."""
        z = self._z
        try:
            while True:
                out = z.decompress(data, size)
                if out:
                    yield out
                data = z.unconsumed_tail
                # A full piece may leave output inside zlib even with no input left: ask once more.
                if not data and len(out) < size:
                    return
        except zlib.error as exc:
            raise _undecodable(self._upstream, exc) from None

    def flush(self) -> bytes:
        """What is left at the end of the body: all input was consumed by then, so this is at most a few bytes."""
        try:
            return self._z.flush()
        except zlib.error as exc:
            raise _undecodable(self._upstream, exc) from None


def decoded(raw: AsyncIterator[bytes], decoder: ContentDecoder | None) -> AsyncIterator[bytes]:
    """A body as it arrives, decoded: raw chunks as the connection delivers them (``raw`` itself, when there is
    nothing to decode), or decoded pieces of at most ``PIECE`` bytes. It is for streams, whose limit is per event;
    a whole body is read with ``read_limited``."""
    return raw if decoder is None else _pieces(raw, decoder)


async def _pieces(raw: AsyncIterator[bytes], decoder: ContentDecoder) -> AsyncIterator[bytes]:
    async for chunk in raw:
        for piece in decoder.pieces(chunk):
            yield piece
    tail = decoder.flush()
    if tail:
        yield tail


async def read_limited(upstream: str, raw: AsyncIterator[bytes], decoder: ContentDecoder | None,
                       limit: int) -> bytes:
    """A whole body, at most ``limit`` bytes once decoded; past that, ``too_large`` is raised while reading."""
    parts: list[bytes] = []
    left = limit
    async for chunk in raw:
        if decoder is not None:
            chunk = decoder.decode(chunk, left + 1)
        left -= len(chunk)
        if left < 0:
            raise too_large(upstream, limit)
        parts.append(chunk)
    if decoder is not None:
        tail = decoder.flush()
        left -= len(tail)
        if left < 0:
            raise too_large(upstream, limit)
        parts.append(tail)
    return parts[0] if len(parts) == 1 else b"".join(parts)
