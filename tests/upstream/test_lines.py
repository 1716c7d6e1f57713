"""Framing a child's stdout (bastion.upstream.lines): every line whole up to max_line, however the pipe splits it,
and nothing longer."""

from __future__ import annotations

import asyncio
import sys

import pytest

from bastion.upstream.lines import PIPE_LIMIT, LineTooLong, discard, read_lines


def stream_of(*chunks: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=PIPE_LIMIT)
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    return reader


async def lines(max_line: int, *chunks: bytes) -> list[bytes]:
    return [line async for line in read_lines(stream_of(*chunks), max_line)]


async def test_lines_come_whole_however_the_pipe_splits_them() -> None:
    big = b"y" * (3 * PIPE_LIMIT + 17)
    data = b'{"a":1}\n{"b":2}\n' + big + b"\n" + b"tail"
    expected = [b'{"a":1}\n', b'{"b":2}\n', big + b"\n", b"tail"]
    assert await lines(len(big), data) == expected
    for cut in (1, 7, 8, 9, PIPE_LIMIT, PIPE_LIMIT + 1, len(data) - 1):
        assert await lines(len(big), data[:cut], data[cut:]) == expected
    assert await lines(len(big), *[data[i:i + 1000] for i in range(0, len(data), 1000)]) == expected


async def test_a_line_of_max_line_passes_and_one_byte_more_ends_the_stream() -> None:
    limit = 2 * PIPE_LIMIT + 5
    exact = b"x" * limit
    assert await lines(limit, exact + b"\n", b"ok\n") == [exact + b"\n", b"ok\n"]
    assert await lines(limit, exact[:100], exact[100:] + b"\n") == [exact + b"\n"]
    with pytest.raises(LineTooLong):
        await lines(limit, exact + b"x\n")
    with pytest.raises(LineTooLong):
        await lines(limit, exact[:100], exact[100:] + b"x\n")
    with pytest.raises(LineTooLong):  # no newline yet: refused as soon as the line is longer, not at its end
        await lines(limit, exact + b"x", b"y" * (10 * PIPE_LIMIT))
    assert await lines(5, b"") == []


async def test_a_child_that_stopped_being_read_can_be_waited_for_once_its_pipe_is_discarded() -> None:
    """Process.wait() returns only once every pipe closed, and a pipe paused with more than 2 * PIPE_LIMIT unread
    never sees its end: a reader that gives up on a line must read the rest to the end."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys, time; sys.stdout.write('x' * 4_000_000); sys.stdout.flush(); "
                              "time.sleep(60)", stdout=asyncio.subprocess.PIPE, limit=PIPE_LIMIT)
    assert proc.stdout is not None
    try:
        await proc.stdout.readexactly(PIPE_LIMIT)  # a reader's first chunk, then it gives up
        while len(proc.stdout._buffer) <= 2 * PIPE_LIMIT:  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)  # the pipe is paused now
    finally:
        proc.kill()
    await discard(proc.stdout)
    async with asyncio.timeout(30):  # a guard against a hang, not a measurement
        assert await proc.wait() == -9
