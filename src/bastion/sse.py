"""Server-Sent Events: a pure encoder and an incremental decoder (WHATWG HTML "event stream" rules).

The front door encodes its SSE responses with ``encode_event``; the back door feeds upstream bytes into
``SseDecoder`` as they arrive. Neither does I/O, so both are tested over scripted byte strings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["MAX_RETRY_MS", "SseDecoder", "SseEvent", "SseEventTooLarge", "encode_event"]

_BOM = "\ufeff"
# The longest reconnection delay a stream may ask for (``retry``), in ms: one hour. A longer one is taken as this.
# The field is the peer's digits: unbounded, 5,000 of them made ``int`` raise (Python's limit on digits) and 400 a
# float overflow wherever the delay was used, each ending the reader that met it.
MAX_RETRY_MS = 3_600_000
_MAX_RETRY_DIGITS = len(str(MAX_RETRY_MS))


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event. ``id`` is the stream's last event id at dispatch time (it persists across events)."""

    data: str
    event: str = "message"
    id: str | None = None


def _check_field(name: str, value: str) -> None:
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"SSE {name} must not contain CR, LF or NUL")


def encode_event(data: bytes, *, event: str | None = None, id: str | None = None, retry: int | None = None) -> bytes:
    """Encode one event. Multi-line ``data`` becomes several ``data:`` lines, which the decoder joins back."""
    parts: list[bytes] = []
    if event is not None:
        _check_field("event", event)
        parts.append(b"event: " + event.encode())
    if id is not None:
        _check_field("id", id)
        parts.append(b"id: " + id.encode())
    if retry is not None:
        if retry < 0:
            raise ValueError("SSE retry must be non-negative")
        parts.append(b"retry: " + str(retry).encode())
    # Normalise CRLF and lone CR first: each is a line break to the decoder, and must not leak into the payload.
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    parts.extend(b"data: " + line for line in lines)
    return b"\n".join(parts) + b"\n\n"


class SseEventTooLarge(ValueError):
    """An event (its data lines, and the line still arriving) grew past the decoder's ``max_event_bytes``."""


class SseDecoder:
    """Feed bytes in any chunking; get complete events out.

    ``retry`` holds the last valid reconnection delay (ms) the stream asked for, at most ``MAX_RETRY_MS``;
    ``last_event_id`` the last id.
    With ``max_event_bytes``, an event whose data lines plus the line still arriving pass that many bytes raises
    ``SseEventTooLarge`` from ``feed`` as soon as they do; the stream cannot be resynchronised after that. A line
    arriving in many chunks is held as its pieces and joined once, when its end arrives.
    """

    __slots__ = ("_data", "_event", "_partial", "_parts", "_pending_cr", "_size", "_started", "last_event_id",
                 "max_event_bytes", "retry")

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self.max_event_bytes = max_event_bytes
        self._parts: list[bytes] = []  # an unfinished line, as it arrived
        self._partial = 0  # its length
        self._size = 0  # the current event's data lines (bytes, with a line break each)
        self._data: list[str] = []
        self._event = ""
        self._pending_cr = False
        self._started = False
        self.last_event_id: str | None = None
        self.retry: int | None = None

    def feed(self, chunk: bytes) -> Iterator[SseEvent]:
        if self._pending_cr and chunk.startswith(b"\n"):
            # The previous chunk ended in CR and this LF completes the same CRLF, not an empty line.
            chunk = chunk[1:]
        self._pending_cr = False
        if self._parts:
            if b"\n" not in chunk and b"\r" not in chunk:
                # Still the same line: joining it with what came before on every chunk would be quadratic.
                self._hold(chunk)
                return
            buf = b"".join(self._parts) + chunk
            self._parts = []
            self._partial = 0
        else:
            buf = chunk
        start = 0
        size = len(buf)
        while start < size:
            cr = buf.find(b"\r", start)
            lf = buf.find(b"\n", start)
            if cr == -1 and lf == -1:
                break
            if cr == -1 or (lf != -1 and lf < cr):
                end, nxt = lf, lf + 1
            elif cr + 1 < size:
                end, nxt = cr, cr + 2 if buf[cr + 1] == 0x0A else cr + 1
            else:
                end, nxt = cr, cr + 1
                self._pending_cr = True
            event = self._line(buf[start:end].decode("utf-8", errors="replace"), end - start)
            start = nxt
            if event is not None:
                yield event
        if start < size:
            self._hold(buf[start:] if start else buf)

    def _hold(self, piece: bytes) -> None:
        if piece:
            self._parts.append(piece)
            self._partial += len(piece)
            self._check()

    def _check(self) -> None:
        if self.max_event_bytes is not None and self._size + self._partial > self.max_event_bytes:
            raise SseEventTooLarge(f"SSE event over {self.max_event_bytes} bytes")

    def _line(self, line: str, length: int) -> SseEvent | None:
        if not self._started:
            self._started = True
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._size += length + 1
            if self.max_event_bytes is not None and self._size > self.max_event_bytes:
                self._check()
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            value = value.lstrip("0") or "0"
            self.retry = MAX_RETRY_MS if len(value) > _MAX_RETRY_DIGITS else min(int(value), MAX_RETRY_MS)
        return None

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        self._size = 0
        if not data:
            return None
        return SseEvent(data="\n".join(data), event=event or "message", id=self.last_event_id)
