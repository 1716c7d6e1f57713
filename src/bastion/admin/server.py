"""The console's own listener: a second uvicorn server in the gateway's process and event loop.

Started by the gateway's lifespan after the pool (so the first page shows connected upstreams) and stopped before
the pool closes. Sharing the loop means the console reads the live objects directly (no IPC, no copies), and a
console request is just another coroutine. uvicorn's signal capture is disabled for this server: the main server
owns SIGTERM/SIGINT, and its lifespan shutdown stops this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import structlog
import uvicorn

from bastion.listener import bind_listener

log = structlog.get_logger("bastion.admin")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AdminServer:
    def __init__(self, app: Any, host: str, port: int) -> None:
        self._app = app
        self.host = host
        self.port = port
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind and serve. A port in use raises ``OSError`` here, failing the gateway's start-up loudly."""
        sock = bind_listener(self.host, self.port)
        sock.listen(128)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, log_config=None, access_log=False, lifespan="off", server_header=False,
                                proxy_headers=False, ws="none", timeout_graceful_shutdown=2)
        config.load()
        server = self._server = _Server(config)
        server.lifespan = config.lifespan_class(config)
        # uvicorn's own serve() split in two: start-up here (so start() returns once accepting), then the main
        # loop and shutdown in a task of the gateway's loop.
        await server.startup(sockets=[sock])
        self._task = asyncio.create_task(self._run(sock), name="bastion-admin")
        log.info("admin.ready", url=f"http://{_url_host(self.host)}:{self.port}/")

    async def _run(self, sock: socket.socket) -> None:
        assert self._server is not None
        await self._server.main_loop()
        await self._server.shutdown(sockets=[sock])

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await self._task


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
