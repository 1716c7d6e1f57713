"""A uvicorn server in the test's own event loop, for in-process tests of bastion's HTTP protocol."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import uvicorn


@contextlib.asynccontextmanager
async def serving(config: uvicorn.Config) -> AsyncIterator[uvicorn.Server]:
    """Serve ``config`` until the block ends: started (listening) on entry, stopped on exit."""
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
        assert not task.done(), task
    try:
        yield server
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
