"""A stdio server's process: started with only its stdin, stdout and stderr, in a process group of its own, and
known to have exited when it has.

Spawning. The child inherits descriptors 0, 1 and 2 and nothing else, whatever event loop runs the gateway. The
loop's own ``subprocess_exec`` cannot promise that: uvloop (libuv) implements no ``close_fds``, so a child it
spawns inherited every descriptor the gateway had open without ``O_CLOEXEC`` (a file a library opened, the
listening socket) and kept a second copy of each of its own stdio socket ends. Because of those copies, a server
that closed its stdin still held the read end open, and bastion's writes never failed: it could not tell. So the
child is started by the standard library (``subprocess.Popen`` with ``close_fds=True``, which closes everything
above 2 in the child, in C, with no ``preexec_fn``) and its pipes are wired into the running loop
(``connect_read_pipe``/``connect_write_pipe``, which every loop implements).

Exit. A stream reaches EOF only when every process holding its write end has closed it, so a helper the server
started (it inherits its pipes) keeps stdout open after the server died. ``Child`` therefore hears of the exit
itself: on Linux through a pidfd that the loop watches (readable when the child exits), elsewhere through a thread
that waits for it. At the exit it reaps the child, kills the rest of its process group (the child leads a new
session, so the group is the server's and its helpers'), and ``release`` closes bastion's ends of the pipes, which
a helper that left the group may still hold.

The process the command started is the server: when it exits, the connection is over, whatever it forked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO

__all__ = ["Child", "kill_group", "spawn"]


def kill_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to every process of the group; a group already empty is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _StdinProtocol(asyncio.streams.FlowControlMixin):
    """The protocol behind the child's stdin ``StreamWriter``: flow control, and ``lost`` once the pipe is gone
    (the child closed its end, or a write failed), so the connection can end without waiting for a reply."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.lost = asyncio.Event()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.lost.set()


class Child:
    """A started server process: its ``stdin``, ``stdout`` and ``stderr`` streams, and when it ``exited``."""

    __slots__ = ("_exited", "_popen", "_readers", "_stdin_protocol", "stderr", "stdin", "stdout")

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self._exited = asyncio.Event()
        self._readers: list[asyncio.BaseTransport] = []
        self._stdin_protocol: _StdinProtocol | None = None
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    def has_exited(self) -> bool:
        """Whether the child has exited, asking the system now (it may have exited before the loop told us): a
        child that is gone is ended by its exit, with its exit code, not replaced as one that stopped listening."""
        if not self.exited and self._popen.poll() is not None:
            self._reaped()
        return self.exited

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait_exited(self, timeout: float | None) -> bool:
        """Wait until the child itself has exited (whoever still holds its pipes), at most ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._exited.wait()
        except TimeoutError:
            return False
        return True

    async def wait(self) -> int:
        """The exit code, once the child has exited (negative: the signal that ended it)."""
        await self._exited.wait()
        code = self._popen.returncode
        assert code is not None  # set before ``_exited``
        return code

    async def stdin_lost(self) -> None:
        """Return once bastion's write end of stdin is gone: the child closed its read end, or a write failed."""
        if self._stdin_protocol is not None:
            await self._stdin_protocol.lost.wait()

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the server and everything in its process group, while the server lives."""
        if not self.exited:
            kill_group(self.pid, sig)

    def release(self) -> None:
        """Close bastion's ends of the pipes (killing the child if it still runs): the streams reach EOF now, even
        if a process outside the group still holds their other ends."""
        self.signal(signal.SIGKILL)
        if self.stdin is not None:
            self.stdin.close()
        for transport in self._readers:
            transport.close()

    def _reaped(self) -> None:
        # Called right after the child was reaped: its process group id cannot have been reused by then (the
        # group lives on while a helper is in it, and was created by our child).
        if self._exited.is_set():
            return
        kill_group(self.pid, signal.SIGKILL)
        self._exited.set()

    def _watch_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
            _wait_in_thread(self._popen, loop, self._reaped)
            return

        def readable() -> None:
            if self._popen.poll() is None:
                return  # not reaped yet: readable again at the next iteration
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._reaped()

        loop.add_reader(pidfd, readable)

    async def _connect(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        popen = self._popen
        assert popen.stdin is not None
        assert popen.stdout is not None
        assert popen.stderr is not None
        self.stdout = await self._reader(loop, popen.stdout, limit)
        self.stderr = await self._reader(loop, popen.stderr, limit)
        transport, protocol = await loop.connect_write_pipe(lambda: _StdinProtocol(loop), popen.stdin)
        self._stdin_protocol = protocol
        self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)

    async def _reader(self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes], limit: int) -> asyncio.StreamReader:
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
        self._readers.append(transport)
        return reader


def _wait_in_thread(popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop,
                    reaped: Callable[[], None]) -> None:
    def wait() -> None:
        popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is left to tell
            loop.call_soon_threadsafe(reaped)

    threading.Thread(target=wait, name=f"bastion-reap-{popen.pid}", daemon=True).start()


def _popen(command: Sequence[str], env: Mapping[str, str], cwd: str | None) -> subprocess.Popen[bytes]:
    # Blocks the loop as briefly as the loops' own subprocess_exec does: fork (vfork where it can) and exec, and
    # a pipe that reports exec's failure.
    return subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            bufsize=0, env=dict(env), cwd=cwd, close_fds=True, start_new_session=True)


async def spawn(command: Sequence[str], *, env: Mapping[str, str], cwd: str | None, limit: int) -> Child:
    """Start ``command`` with piped stdin, stdout and stderr and no other descriptor, as the leader of a new
    session (process group). Raises ``OSError`` when it cannot be started."""
    loop = asyncio.get_running_loop()
    popen = _popen(command, env, cwd)
    child = Child(popen)
    child._watch_exit(loop)
    try:
        await child._connect(loop, limit)
    except BaseException:
        child.release()
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            if pipe is not None:
                pipe.close()
        raise
    return child
