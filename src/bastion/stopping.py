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
again at its next await. A task still cleaning up when asked again has that cleanup cut short; the only cleanups in
bastion's background tasks (leaving a Redis pub/sub subscription) take well under a millisecond, so only one stalled
on a dead peer is cut, and shutdown should not wait for that anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["cancel_and_wait"]

# How long a cancelled task gets to finish before it is asked again: long enough that a task finishing normally
# is asked once, short enough that a dropped request costs shutdown no visible time.
_RECANCEL_S = 0.05


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
