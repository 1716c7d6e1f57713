"""Whether the event loop stays free while something runs: a task that counts its turns."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Ticks:
    """How many turns the ticker got so far."""

    count = 0


@contextlib.asynccontextmanager
async def ticking(interval: float = 0.0) -> AsyncIterator[Ticks]:
    """A task that counts a tick every ``interval`` seconds (0: every turn of the loop) for the block; a block
    that blocks the loop leaves the count where it was."""
    ticks = Ticks()

    async def tick() -> None:
        while True:
            ticks.count += 1
            await asyncio.sleep(interval)

    task = asyncio.create_task(tick())
    try:
        yield ticks
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
