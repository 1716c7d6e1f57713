"""Newline-delimited messages from a child's pipe, with what bastion holds of the pipe bounded.

asyncio's ``StreamReader`` stops reading the pipe (pauses the transport) only once it holds more than twice its
``limit``, and ``readline`` refuses a line longer than that ``limit``. A stdio upstream's messages may be as large
as ``max_message_size`` (64 MiB), so a reader that frames with ``readline`` needs that ``limit``, and then holds
up to twice it (128 MiB) of whatever the child sends faster than bastion handles it: a ping flood of small
messages, for one.

So the two are separated here. The pipe's reader gets a small ``limit`` (``PIPE_LIMIT``): the pipe is paused
once ``2 * PIPE_LIMIT`` bytes wait unread, and resumed as they are taken. ``read_lines`` takes at most
``PIPE_LIMIT`` bytes at a time and hands over every complete line in them, one at a time, before it takes more,
so a flood of small messages waits in the pipe (the child blocks on its full pipe), not in bastion. Only the one
message being assembled may grow beyond that, up to ``max_line`` bytes (its newline not counted): a message as
large as the upstream may send is never cut, and one larger ends the stream with ``LineTooLong``. What bastion
holds of the pipe is therefore at most ``2 * PIPE_LIMIT`` + one chunk + the message being assembled.

A reader that stops before the end (a line too long) must still ``discard`` the rest, or close the pipe (the stdio
transport closes its ends, ``upstream.child.Child.release``): with more than ``2 * PIPE_LIMIT`` unread the pipe
stays paused, never sees its end, and ``Process.wait()`` (which waits for every pipe of the child to close) never
returns.

A reader that keeps finding data never waits, and so never lets the event loop run anything else; it yields
after every ``YIELD_BYTES`` taken that way (``bastion.upstream.stderr`` does the same for stderr).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

__all__ = ["PIPE_LIMIT", "YIELD_BYTES", "LineTooLong", "discard", "read_lines"]

# The pipe's StreamReader limit: the pipe is paused past twice this unread. Large enough that a typical message
# arrives in one or two reads, small enough that a flood waits in the child's pipe.
PIPE_LIMIT = 64 * 1024
YIELD_BYTES = 1024 * 1024


class LineTooLong(ValueError):
    """A line longer than the stream's ``max_line``: the stream cannot be resynchronised safely."""


async def read_lines(stream: asyncio.StreamReader, max_line: int) -> AsyncIterator[bytes]:
    """Each line of ``stream``, its newline included, until the end of the stream (a last line without one is
    yielded as it is, like ``StreamReader.readline``). Raises ``LineTooLong`` past ``max_line`` bytes."""
    partial = bytearray()  # the line being assembled, when a chunk ended inside it
    unyielded = 0
    while True:
        chunk = await stream.read(PIPE_LIMIT)
        if not chunk:
            if partial:
                yield bytes(partial)
            return
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if partial:
                if len(partial) + end - start > max_line:
                    raise LineTooLong(f"a line of more than {max_line} bytes")
                partial += chunk[start:end + 1]
                line = bytes(partial)
                partial.clear()
            else:
                if end - start > max_line:
                    raise LineTooLong(f"a line of more than {max_line} bytes")
                line = chunk[start:end + 1] if start or end + 1 < len(chunk) else chunk
            start = end + 1
            yield line
        if start < len(chunk):
            if len(partial) + len(chunk) - start > max_line:
                raise LineTooLong(f"a line of more than {max_line} bytes")
            partial += chunk[start:] if start else chunk
        unyielded += len(chunk)
        if unyielded >= YIELD_BYTES:
            unyielded = 0
            await asyncio.sleep(0)


async def discard(stream: asyncio.StreamReader) -> None:
    """Read ``stream`` to its end, dropping what it holds (after the child was killed: only what the pipe held)."""
    unyielded = 0
    try:
        while chunk := await stream.read(PIPE_LIMIT):
            unyielded += len(chunk)
            if unyielded >= YIELD_BYTES:
                unyielded = 0
                await asyncio.sleep(0)
    except (OSError, ValueError):
        pass  # the pipe broke: it is closed either way
