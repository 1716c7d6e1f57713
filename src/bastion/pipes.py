"""Writing to a descriptor someone else drains (stdout, stderr) without ever waiting on the event loop.

In a container, standard output and standard error are pipes read by the runtime's log agent. A pipe holds 64 KB;
when the agent falls behind or dies it fills, and a plain ``write`` then blocks until there is room. On the event
loop that stops the whole gateway, health probes included, for as long as the agent is away. ``pwritev2`` with
``RWF_NOWAIT`` writes what the pipe can take now (the whole line, nothing, or part of a long one) and never waits;
what it could not take is the caller's to hand to a thread (``audit.sinks.StdoutSink``) or to drop and count
(``logs``).

Regular files on most file systems (ext4 among them), terminals, and kernels older than 5.x for pipes refuse the
flag; ``NoWait`` then says so once (``None``), and the caller writes as it would have without it.
"""

from __future__ import annotations

import errno
import os
import select

__all__ = ["NoWait", "write_all"]

# What pwritev2 answers for a descriptor that cannot be written without waiting.
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ESPIPE, errno.ENOSYS})
_RWF_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)


class NoWait:
    """Writes to one descriptor without waiting, as long as the descriptor allows it."""

    __slots__ = ("_flag", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._flag = _RWF_NOWAIT

    @property
    def supported(self) -> bool:
        return self._flag is not None

    def write(self, data: bytes) -> int | None:
        """How many bytes of ``data`` the descriptor took at once (0 when it is full); None when it cannot be
        written without waiting, which then holds for good. Other ``OSError``s (a closed pipe) are raised."""
        if self._flag is None:
            return None
        try:
            return os.pwritev(self.fd, [data], -1, self._flag)
        except BlockingIOError:
            return 0
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
            self._flag = None
            return None


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``, waiting for room as long as it takes (on a worker thread, never the event loop)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            # Someone made the descriptor non-blocking: wait for room here all the same.
            select.select([], [fd], [], 1.0)
