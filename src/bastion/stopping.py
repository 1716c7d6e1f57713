"""Stop background tasks whatever the code inside them does with a cancellation.

``task.cancel()`` asks once: the request is delivered at the task's next await, and if code on that await
catches it and carries on, the task runs on as if never asked. Code that bastion's tasks call does exactly that on
Python 3.11: ``asyncio.wait_for`` (which redis-py uses to bound a socket write when ``socket_timeout`` is set)
returns the inner result and drops the cancellation when the inner await finishes in the same loop iteration as
the cancel arrives (CPython gh-86296, fixed in 3.12). A loop such as the session sweeper, cancelled during one of
its Redis round trips, then went back to sleeping and sweeping, and the shutdown awaiting it waited forever: about
one shutdown in fifteen hung until the process was killed, and the sessions' and the audit log's last records
were lost with it.

``cancel_and_wait`` makes cancellation level-triggered, as anyio and trio do: it cancels, waits, and cancels again
every ``_RECANCEL_S`` any task that has not finished, until all have. A task that dropped a cancellation is asked
again at its next await.

A task still cleaning up after a cancellation when it is asked again would have that cleanup cut short: a stdio
upstream cancelled in its handshake, for one, stops the child it spawned (end of input, a grace period, SIGTERM,
SIGKILL), and cut short it leaves the child running with nobody to stop it. Cleanup whose interruption would leave
something behind outside the process therefore runs through ``finish``, which carries it to its end whatever
cancellations arrive meanwhile, then passes the cancellation on. (Closing a socket needs no such care: whatever is
left of it goes with the process.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

__all__ = ["StopRequest", "cancel_and_wait", "finish"]

T = TypeVar("T")

# How long a cancelled task gets to finish before it is asked again: long enough that a task ending normally is
# asked once, short enough that a dropped request costs shutdown no noticeable time.
_RECANCEL_S = 0.2


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and return once every one has finished; their results and exceptions are discarded.

    The caller's own task is skipped (a component closed from inside its own loop cannot wait for itself).
    """
    current = asyncio.current_task()
    waiting = [task for task in tasks if task is not current]
    pending = {task for task in waiting if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=_RECANCEL_S)
    for task in waiting:
        # Retrieved, so asyncio does not log "exception was never retrieved" for a task that failed on its way out.
        if not task.cancelled():
            task.exception()


async def finish(cleanup: Awaitable[T]) -> T:
    """Await ``cleanup`` to its end even when this task is cancelled meanwhile, once or repeatedly; then raise the
    (last) cancellation, or return ``cleanup``'s result when none came."""
    inner = asyncio.ensure_future(cleanup)
    interrupted: asyncio.CancelledError | None = None
    while not inner.done():
        try:
            # ``wait`` leaves ``inner`` running when this task is cancelled (``await inner`` would cancel it).
            await asyncio.wait({inner})
        except asyncio.CancelledError as exc:
            interrupted = exc
    if interrupted is not None:
        if not inner.cancelled():
            inner.exception()  # retrieved: the cancellation is what this task reports now
        raise interrupted
    return inner.result()


class StopRequest:
    """A stop asked for by a signal, for coroutines to see: the server's signal handler calls ``request`` (in the
    main thread, between any two bytecodes of whatever the loop runs), the lifespan awaits ``wait``.

    uvicorn only sets a flag on SIGTERM, which it reads once the lifespan's start-up returns; a start-up waiting on
    an upstream that does not answer would otherwise finish its wait (the upstream's timeout), log ``ready`` and
    only then stop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self.requested = False

    def bind(self) -> None:
        """In the event loop that will ``wait``: a request made before this is kept."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if self.requested:
            self._event.set()

    def request(self) -> None:
        """Safe in a signal handler: the event is set by the loop itself, woken through its self-pipe."""
        self.requested = True
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self) -> None:
        assert self._event is not None, "StopRequest.wait before bind"
        await self._event.wait()
