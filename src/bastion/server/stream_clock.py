"""How a long-lived stream waits for its next message: a tick when it has been idle for a while, and its end once
the credential it was opened with has expired.

A stream (a session's GET stream, a 2026-07-28 ``subscriptions/listen``) is authorised once, when it opens, and
may stay open for hours. Every request is authenticated on its own, so a stream must not outlive what
authenticated it: a JWT's ``exp`` (``Principal.expires_at``) ends it, as the next request with that token would
be refused. Both streams wait here, so neither can forget it.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["Idle", "next_message"]

T = TypeVar("T")


class Idle(enum.Enum):
    """What ``next_message`` returns instead of a message."""

    TICK = "tick"  # nothing came for a tick: send a keep-alive, re-check what the stream depends on
    EXPIRED = "expired"  # the credential the stream was opened with has expired: end the stream


async def next_message(get: Callable[[], Awaitable[T]], tick_s: float, expires_at: float | None,
                       recheck: Callable[[], Awaitable[None]] | None = None) -> T | Idle:
    """The next message ``get`` returns within ``tick_s``, else ``Idle.TICK``; ``Idle.EXPIRED`` once
    ``expires_at`` (epoch seconds) has passed, without waiting, and never a message after it. ``recheck``
    (``Standing.recheck``) ends the wait early with ``Idle.TICK``: what the stream depends on is due a check now.

    ``get`` must leave its message queued when cancelled (``Outbox.get`` and ``asyncio.Queue.get`` do)."""
    wait = tick_s if expires_at is None else min(tick_s, expires_at - time.time())
    if wait <= 0:
        return Idle.EXPIRED
    if recheck is not None:
        return await _first(get, recheck, wait)
    try:
        async with asyncio.timeout(wait):
            return await get()
    except TimeoutError:
        return Idle.TICK


async def _first(get: Callable[[], Awaitable[T]], recheck: Callable[[], Awaitable[None]], wait: float) -> T | Idle:
    message = asyncio.ensure_future(get())
    woken = asyncio.ensure_future(recheck())
    try:
        # No timeout around it that could cancel a ``get`` which has just taken its message: ``wait``'s own.
        await asyncio.wait((message, woken), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (message, woken):
            if not task.done():
                task.cancel()
    if message.done() and not message.cancelled():
        return message.result()  # taken: delivered, even when a recheck is due as well (it is next)
    return Idle.TICK
