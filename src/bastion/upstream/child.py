"""A stdio server's process: started in a process group of its own, and known to have exited when it has.

asyncio's ``Process.wait()`` may return only once the child has exited *and* every pipe to it is closed (CPython
3.11's does), and a
stream reaches EOF only when every process holding its write end has closed it. A helper the server started
inherits its pipes; if the server then exits (crashes) while the helper lives on, neither ever happens: the
server's death would go unnoticed, and waiting for it would never end. So ``Child`` hears of the exit itself
(``exited``, set by the protocol's ``process_exited``, which the event loop calls when it reaps the child) and
ends what the server left behind: at the exit it kills the rest of its process group (the child was started with
``start_new_session``, so the group is the server's and its helpers'), and ``release`` closes bastion's ends of
the pipes, which a helper that left the group may still hold.

The process the command started is the server: when it exits, the connection is over, whatever it forked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence

__all__ = ["Child", "spawn"]


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()
        self.pid: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # uvloop's process transport is no ``asyncio.SubprocessTransport`` subclass, but has its methods.
        get_pid = getattr(transport, "get_pid", None)
        if get_pid is not None:
            self.pid = get_pid()

    def process_exited(self) -> None:
        # Called right after the child was reaped: its process group id cannot have been reused by then (the
        # group lives on while a helper is in it, and was created by our child).
        if self.pid is not None:
            kill_group(self.pid, signal.SIGKILL)
        super().process_exited()
        self.exited.set()


def kill_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to every process of the group; a group already empty is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Child:
    """A started server process: its ``process`` (stdin, stdout, stderr streams) and when it ``exited``."""

    __slots__ = ("_protocol", "_transport", "process")

    def __init__(self, transport: asyncio.SubprocessTransport, protocol: _Protocol,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._protocol = protocol
        # What ``asyncio.create_subprocess_exec`` builds from the same two objects.
        self.process = asyncio.subprocess.Process(transport, protocol, loop)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exited(self) -> bool:
        return self._protocol.exited.is_set()

    async def wait_exited(self, timeout: float | None) -> bool:
        """Wait until the child itself has exited (whoever still holds its pipes), at most ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._protocol.exited.wait()
        except TimeoutError:
            return False
        return True

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the server and everything in its process group, while the server lives."""
        if not self.exited:
            kill_group(self.pid, sig)

    def release(self) -> None:
        """Close bastion's ends of the pipes (killing the child if it still runs): the streams reach EOF now, and
        ``process.wait()`` can return, even if a process outside the group still holds their other ends."""
        self._transport.close()


async def spawn(command: Sequence[str], *, env: Mapping[str, str], cwd: str | None, limit: int) -> Child:
    """Start ``command`` with piped stdin, stdout and stderr, as the leader of a new session (process group).
    Raises ``OSError`` when it cannot be started."""
    loop = asyncio.get_running_loop()
    protocol = _Protocol(limit, loop)
    transport, _ = await loop.subprocess_exec(
        lambda: protocol, *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=dict(env), cwd=cwd, start_new_session=True)
    if protocol.pid is None:  # pragma: no cover - every loop we know tells the protocol of its transport
        protocol.pid = transport.get_pid()
        if protocol.exited.is_set():
            kill_group(protocol.pid, signal.SIGKILL)
    return Child(transport, protocol, loop)
