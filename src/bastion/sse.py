"""Server-Sent Events: a pure encoder and an incremental decoder (WHATWG HTML "event stream" rules).

The front door encodes its SSE responses with ``encode_event``; the back door feeds upstream bytes into
``SseDecoder`` as they arrive. Neither does I/O, so both are tested over scripted byte strings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["SseDecoder", "SseEvent", "encode_event"]

_BOM = "\ufeff"


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


class SseDecoder:
    """Feed bytes in any chunking; get complete events out.

    ``retry`` holds the last valid reconnection delay (ms) the stream asked for, ``last_event_id`` the last id.
    """

    __slots__ = ("_buf", "_data", "_event", "_pending_cr", "_started", "last_event_id", "retry")

    def __init__(self) -> None:
        self._buf = b""
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
        buf = self._buf + chunk
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
            event = self._line(buf[start:end].decode("utf-8", errors="replace"))
            start = nxt
            if event is not None:
                yield event
        self._buf = buf[start:]

    def _line(self, line: str) -> SseEvent | None:
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
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SseEvent(data="\n".join(data), event=event or "message", id=self.last_event_id)
