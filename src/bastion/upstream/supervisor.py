"""Keeping one upstream connection alive: reconnect after it drops, with capped exponential backoff.

Used by the transports whose connection can die as a whole (a stdio child process, an HTTP+SSE stream).
While a reconnect attempt runs, requests wait for it (within their own timeout); while the supervisor sleeps
between attempts, requests fail at once with ``UpstreamUnavailable`` rather than pile up.

Every failed attempt is followed by another, whatever it failed with: a restarted server that answers its
handshake with a JSON-RPC error, or not in time, is as much a failed attempt as one that cannot be reached. Nothing
else restarts a transport the gateway holds as connected, so a reconnect loop that ended on an error it did not
expect would leave that upstream down until the gateway restarts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import structlog

from bastion.errors import RequestError, UpstreamUnavailable
from bastion.stopping import cancel_and_wait, finish
from bastion.upstream.base import UpstreamInfo

__all__ = ["Backoff", "StateListener", "Supervisor"]

log = structlog.get_logger("bastion.upstream")

State = Literal["idle", "connected", "connecting", "waiting", "closed"]
# Told when a live connection is being re-established ("restarting", why), when it is back ("connected", ""),
# and of signs of trouble that need a probe to confirm ("suspect", why: a stream that ended).
StateListener = Callable[[str, str], None]


class Backoff:
    """Delay before reconnect attempt ``n``: the first retry of a connection that had been stable is immediate."""

    __slots__ = ("attempt", "initial", "maximum", "stable_after")

    def __init__(self, initial: float, maximum: float, stable_after: float = 30.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.stable_after = stable_after
        self.attempt = 0

    def next_delay(self) -> float:
        attempt = self.attempt
        self.attempt += 1
        if attempt == 0:
            return 0.0
        return float(min(self.maximum, self.initial * 2 ** (attempt - 1)))

    def reset(self) -> None:
        """Start over, as a new connection does."""
        self.attempt = 0

    def connection_ended(self, uptime: float) -> None:
        # A connection that dies right after coming up is a crash loop: keep escalating instead of resetting.
        if uptime >= self.stable_after:
            self.attempt = 0


class Supervisor:
    def __init__(self, name: str, connect: Callable[[], Awaitable[UpstreamInfo]],
                 on_reconnected: Callable[[], Awaitable[None]], backoff: Backoff) -> None:
        self.name = name
        self.info: UpstreamInfo | None = None
        self._connect = connect
        self._on_reconnected = on_reconnected
        self._backoff = backoff
        self._state: State = "idle"
        self._connected = asyncio.Event()
        self._since = 0.0
        self._task: asyncio.Task[None] | None = None
        self.on_state: StateListener | None = None

    def _tell(self, event: str, detail: str) -> None:
        if self.on_state is not None:
            self.on_state(event, detail)

    @property
    def connected(self) -> bool:
        return self._state == "connected"

    async def start(self) -> UpstreamInfo:
        """Connect, for the first time or again after ``aclose``: either way from scratch."""
        self._state = "connecting"
        # After aclose the event is still set (it woke the waiters); left so, ``ready`` would not wait for this start.
        self._connected.clear()
        self._backoff.reset()
        try:
            info = await self._connect()
        except BaseException:
            self._state = "idle"
            raise
        self._up(info)
        return info

    def _up(self, info: UpstreamInfo) -> None:
        self.info = info
        self._state = "connected"
        self._since = time.monotonic()
        self._connected.set()

    def lost(self, detail: str, cleanup: Callable[[], Awaitable[None]] | None = None) -> None:
        """The transport saw its connection end. Starts reconnecting in the background, after ``cleanup`` (ending
        what is left of the old connection, such as a child that runs but cannot be talked to) has finished."""
        if self._state != "connected":
            return
        log.warning("upstream.connection_lost", upstream=self.name, detail=detail)
        self._connected.clear()
        self._backoff.connection_ended(time.monotonic() - self._since)
        self._state = "waiting"
        self._task = asyncio.get_running_loop().create_task(self._reconnect(cleanup))
        self._tell("restarting", detail)

    async def ready(self, timeout: float) -> None:
        if self._state == "connected":
            return
        if self._state != "connecting":
            raise UpstreamUnavailable(self.name, log_detail=f"upstream is {self._state}")
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            raise UpstreamUnavailable(self.name, log_detail="reconnect still in progress") from None
        if not self.connected:
            raise UpstreamUnavailable(self.name, log_detail="reconnect failed")

    async def _reconnect(self, cleanup: Callable[[], Awaitable[None]] | None) -> None:
        if cleanup is not None:
            try:
                # To its end even through shutdown's cancellations: cut short, it would leave the old child running.
                await finish(cleanup())
            except Exception:
                log.exception("upstream.cleanup_failed", upstream=self.name)
        while self._state != "closed":
            delay = self._backoff.next_delay()
            self._state = "waiting"
            if delay:
                log.info("upstream.reconnect_wait", upstream=self.name, seconds=delay)
                await asyncio.sleep(delay)
            self._state = "connecting"
            try:
                info = await self._connect()
            except RequestError as exc:
                detail = exc.log_detail or exc.message
                log.warning("upstream.reconnect_failed", upstream=self.name, detail=detail)
                self._failed(detail)
                continue
            except Exception as exc:
                # A defect, not the upstream's doing; the upstream still deserves the next attempt.
                log.exception("upstream.reconnect_failed", upstream=self.name)
                self._failed(f"{type(exc).__name__}: {exc}")
                continue
            self._up(info)
            log.info("upstream.reconnected", upstream=self.name)
            self._tell("connected", "")
            try:
                await self._on_reconnected()
            except Exception:
                log.exception("upstream.reconnect_hook_failed", upstream=self.name)
            return

    def _failed(self, detail: str) -> None:
        # Wake waiters so they fail now instead of at their timeout.
        self._state = "waiting"
        self._connected.set()
        self._connected.clear()
        self._tell("restarting", f"restart failed: {detail}")

    async def aclose(self) -> None:
        self._state = "closed"
        self._connected.set()
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
