"""The SSE encoder and decoder, over scripted byte strings."""

from __future__ import annotations

import pytest

from bastion.sse import MAX_RETRY_MS, SseDecoder, SseEvent, SseEventTooLarge, encode_event


def decode(*chunks: bytes) -> tuple[list[SseEvent], SseDecoder]:
    decoder = SseDecoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    return events, decoder


def test_round_trip_with_all_fields() -> None:
    wire = encode_event(b'{"a":1}\nsecond line', event="message", id="42", retry=1500)
    assert wire == b'event: message\nid: 42\nretry: 1500\ndata: {"a":1}\ndata: second line\n\n'
    events, decoder = decode(wire)
    assert events == [SseEvent(data='{"a":1}\nsecond line', event="message", id="42")]
    assert decoder.retry == 1500
    assert decoder.last_event_id == "42"


def test_empty_data_is_still_an_event() -> None:
    events, _ = decode(encode_event(b"", id="1"))
    assert events == [SseEvent(data="", id="1")]


def test_crlf_in_data_is_normalised() -> None:
    events, _ = decode(encode_event(b"a\r\nb\rc"))
    assert events[0].data == "a\nb\nc"


@pytest.mark.parametrize("field", ["event", "id"])
def test_encoder_rejects_line_breaks_in_fields(field: str) -> None:
    with pytest.raises(ValueError):
        encode_event(b"x", **{field: "a\nb"})


def test_line_endings_lf_crlf_and_cr() -> None:
    events, _ = decode(b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n\n")
    assert [e.data for e in events] == ["a", "b", "c", "d"]


def test_any_chunking_gives_the_same_events() -> None:
    wire = b": comment\r\nevent: endpoint\r\ndata: /messages?x=1\r\n\r\nid: 7\r\ndata: {}\r\n\r\n"
    whole, _ = decode(wire)
    bytewise, _ = decode(*(wire[i:i + 1] for i in range(len(wire))))
    assert whole == bytewise == [SseEvent(data="/messages?x=1", event="endpoint"), SseEvent(data="{}", id="7")]


def test_cr_at_chunk_end_followed_by_lf_is_one_line_break() -> None:
    events, _ = decode(b"data: a\r", b"\n\r", b"\n")
    assert events == [SseEvent(data="a")]


def test_comments_and_unknown_fields_are_ignored() -> None:
    events, _ = decode(b": keep-alive\n\nfoo: bar\ndata\n\n")
    assert events == [SseEvent(data="")]


def test_field_without_space_and_bom() -> None:
    events, _ = decode(b"\xef\xbb\xbfdata:x\n\n")
    assert events == [SseEvent(data="x")]


def test_id_persists_and_invalid_retry_is_ignored() -> None:
    events, decoder = decode(b"id: 5\ndata: a\n\nretry: soon\ndata: b\n\nid\ndata: c\n\n")
    assert [e.id for e in events] == ["5", "5", ""]
    assert decoder.retry is None


@pytest.mark.parametrize(("value", "expected"), [
    (b"1500", 1500), (b"0", 0), (b"0" * 5000 + b"1500", 1500), (str(MAX_RETRY_MS).encode(), MAX_RETRY_MS),
    (str(MAX_RETRY_MS + 1).encode(), MAX_RETRY_MS),
    # A delay no float holds (``retry / 1000`` raised OverflowError where it was used) ...
    (b"9" * 400, MAX_RETRY_MS),
    # ... and more digits than ``int`` parses (it raised ValueError from ``feed``, ending the stream's reader).
    (b"9" * 5000, MAX_RETRY_MS),
], ids=["plain", "zero", "leading-zeros", "at-bound", "over-bound", "400-digits", "5000-digits"])
def test_retry_is_bounded_whatever_its_digits(value: bytes, expected: int) -> None:
    events, decoder = decode(b"retry: " + value + b"\n\ndata: after\n\n")
    assert decoder.retry == expected
    assert events == [SseEvent(data="after")]


def test_retry_alone_dispatches_nothing() -> None:
    events, decoder = decode(b"retry: 3000\n\n")
    assert events == []
    assert decoder.retry == 3000


def test_incomplete_event_is_held_back() -> None:
    decoder = SseDecoder()
    assert list(decoder.feed(b"data: partial")) == []
    assert list(decoder.feed(b"\n")) == []
    assert list(decoder.feed(b"\n")) == [SseEvent(data="partial")]


def test_sse_event_limit_counts_data_lines_and_the_line_still_arriving() -> None:
    decoder = SseDecoder(100)
    assert [e.data for e in decoder.feed(b"data: " + b"x" * 90 + b"\n\n")] == ["x" * 90]
    # Many lines of one event add up; the limit is per event, so the next one starts from nothing.
    with pytest.raises(SseEventTooLarge):
        list(decoder.feed(b"data: " + b"y" * 60 + b"\ndata: " + b"y" * 60 + b"\n"))
    decoder = SseDecoder(100)
    assert list(decoder.feed(b"data: ")) == []
    for _ in range(8):
        assert list(decoder.feed(b"z" * 10)) == []
    with pytest.raises(SseEventTooLarge):  # a line that never ends is refused as it grows
        list(decoder.feed(b"z" * 20))


def test_sse_line_in_many_chunks_comes_out_whole() -> None:
    decoder = SseDecoder()
    events = [e for piece in [b"data: "] + [b"q" * 1000] * 1000 + [b"\n\n"] for e in decoder.feed(piece)]
    assert events[0].data == "q" * 1_000_000
