"""Per-call slots that last as long as the upstream's work on the call, not as long as bastion waits for it.

A concurrency lease counts work an upstream does for a call. When bastion stops waiting for the answer (the client
sent ``notifications/cancelled``, a 2026-07-28 client hung up, bastion's own timeout fired), the upstream may well
go on working: cancellation in MCP is a request, and a tool may ignore it. Freeing the slot then would let a caller
run any number of calls at once under a cap of one, by cancelling each right after sending it.

So a request bastion abandons becomes an ``Abandoned``, kept by the transport's ``RpcSession`` under its request id
until the upstream is done with it, which bastion learns from whichever comes first of:

- the upstream's late answer to that id (a result or an error): ``answered``;
- the upstream's connection or process being lost, closed or restarted (its work went with it): ``connection_lost``;
- ``grace`` seconds after it was abandoned, the upstream's configured ``timeout``: ``grace_expired``. This bounds
  what an upstream that never answers can hold, and is the only end bastion can see over HTTP, where the answer
  would come on the response stream bastion closed when it gave up.

Whatever holds a slot for the call hands its release to the ``Abandoned`` instead of releasing at the end of the
call; each release runs exactly once. The two meet through a ``CallHold`` in a context variable: the holder sets it
for the life of the call (the call's task, so the pipeline and the transports' signatures do not change), and the
session marks it when it abandons a request. An ordinary call pays for one small object and a context variable;
no task, timer or round trip. Only an abandoned request of a call that holds a slot gets a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextvars import ContextVar, Token

import structlog

__all__ = ["Abandoned", "CallHold", "current_hold", "enter_hold", "exit_hold"]

log = structlog.get_logger("bastion.holdover")

# Called once with the reason the upstream is done: ``answered``, ``connection_lost``, ``grace_expired``,
# ``shutdown``. Must not block or raise.
Release = Callable[[str], None]


class Abandoned:
    """One upstream request bastion stopped waiting for, while the upstream may still be working on it."""

    __slots__ = ("_releases", "_timer", "reason", "request_id", "upstream")

    def __init__(self, upstream: str, request_id: int, grace_s: float) -> None:
        self.upstream = upstream
        self.request_id = request_id
        self.reason: str | None = None
        self._releases: list[Release] = []
        self._timer = asyncio.get_running_loop().call_later(max(0.0, grace_s), self.end, "grace_expired")

    @property
    def ended(self) -> bool:
        return self.reason is not None

    def hold(self, release: Release) -> None:
        """Run ``release`` when the upstream is done with the request (at once if it already is)."""
        if self.reason is not None:
            release(self.reason)
        else:
            self._releases.append(release)

    def end(self, reason: str) -> None:
        """The upstream is done with the request; idempotent, the first reason wins."""
        if self.reason is not None:
            return
        self.reason = reason
        self._timer.cancel()
        releases, self._releases = self._releases, []
        for release in releases:
            try:
                release(reason)
            except Exception:
                log.exception("holdover.release_failed", upstream=self.upstream, request_id=self.request_id)


class CallHold:
    """One call's stake in the upstream requests it abandons: present while the call holds a slot."""

    __slots__ = ("abandoned", "closed")

    def __init__(self) -> None:
        self.abandoned: list[Abandoned] = []
        # Set when the call's holders are done with it: a task the call spawned that abandons a request later
        # (its context is a copy of the call's) has no slot left to keep.
        self.closed = False

    def waiting(self, since: int = 0) -> list[Abandoned]:
        """The requests the call abandoned (from the ``since``-th on) that the upstream may still be working on."""
        return [a for a in self.abandoned[since:] if a.reason is None] if len(self.abandoned) > since else []


_current: ContextVar[CallHold | None] = ContextVar("bastion_call_hold", default=None)


def current_hold() -> CallHold | None:
    """The hold of the call running in this task, if something in it holds a slot."""
    return _current.get()


def enter_hold() -> tuple[CallHold, Token[CallHold | None] | None]:
    """The call's hold, made current if it is not yet; pass the token to ``exit_hold`` when the holder is done.
    Several holders of one call share one hold (the token of all but the first is ``None``)."""
    hold = _current.get()
    if hold is not None and not hold.closed:
        return hold, None
    hold = CallHold()
    return hold, _current.set(hold)


def exit_hold(hold: CallHold, token: Token[CallHold | None] | None) -> None:
    """The end of a holder's part in the call; the first holder's end (the one with the token) closes the hold."""
    if token is not None:
        hold.closed = True
        # Left in another context than it was entered in (ValueError): that context's value dies with it.
        with contextlib.suppress(ValueError):
            _current.reset(token)
