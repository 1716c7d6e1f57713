"""Loopback-only network helpers for tests."""

from __future__ import annotations

import itertools
import os
import random
import socket
import time
from collections.abc import Iterator

# Ports the tests' servers listen on come from below the kernel's ephemeral range (32768-60999 on Linux), so no
# client socket the kernel numbers itself can take one, and each pytest-xdist worker draws from a block of its own,
# so two workers never hand out the same port. Asking the kernel for port 0 instead would let two workers be handed
# the same free port between one's probe and its server's bind, and a server found listening there would then be
# the other worker's. The block stays under 20000 so that a Redis Cluster node's bus port (port + 10000) never lands
# in a block either.
_FIRST, _END = 10000, 20000


def _worker() -> tuple[int, int]:
    """This process's worker index and the number of workers (0 of 1 when the run is not distributed)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    return index % max(count, 1), max(count, 1)


def _candidates() -> Iterator[int]:
    index, count = _worker()
    size = (_END - _FIRST) // count
    first = _FIRST + index * size
    # A random start, so that runs following each other do not reuse ports left in TIME_WAIT by the previous one.
    start = random.randrange(size)
    return (first + (start + step) % size for step in itertools.count())


class _Ports:
    """Hands out this worker's ports in turn; a port something holds is skipped."""

    def __init__(self) -> None:
        self._next: Iterator[int] | None = None
        self._pid = 0

    def take(self) -> int:
        if self._next is None or self._pid != os.getpid():
            self._next, self._pid = _candidates(), os.getpid()
        for _, port in zip(range(_END - _FIRST), self._next, strict=False):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
        raise RuntimeError("no free loopback port left in this test worker's block")


_PORTS = _Ports()


def free_port() -> int:
    """A loopback port nothing listens on, distinct from every other this test run has handed out recently."""
    return _PORTS.take()


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")
