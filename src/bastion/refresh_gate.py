"""Per-upstream gates that keep calls off a definition nobody has checked yet.

An upstream's gate closes the moment its tool definitions may have changed (it announced ``list_changed``, or a
fetched list differs from the published one) and opens again only when a view built from lists fetched *after*
that moment is published, so the new definitions have passed pinning, schema compilation and sanitizing. A call
to the upstream's tools in between waits for the gate (bounded) instead of reaching the upstream on the old
definition.

Generations make "fetched after that moment" exact: every announcement bumps the upstream's generation; a fetch
remembers the generation it started at; a publish opens only the gates whose generation it covers. An
announcement that lands while a fetch is in flight therefore keeps the gate closed until the next fetch.

``RefreshRequests`` is the pool refresher's inbox: whoever learns that lists should be fetched again (an
upstream's announcement, a pin store that could not be read, an admin's pin approval) asks here. It is built
before the pool, so the view steps and watchers that ask need no pool, and the pool needs none of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping


class RefreshGate:
    def __init__(self) -> None:
        self._closed: dict[str, asyncio.Event] = {}
        self._generation: dict[str, int] = {}
        # Why an upstream cannot answer right now (the pool's word; see ``unreachable``).
        self._unreachable: dict[str, str] = {}

    def generation(self, upstream: str) -> int:
        return self._generation.get(upstream, 0)

    def announce(self, upstream: str) -> None:
        """The upstream said its definitions changed: close its gate until a later fetch is published."""
        self._generation[upstream] = self.generation(upstream) + 1
        self.hold(upstream)

    def hold(self, upstream: str) -> None:
        """Close the gate without invalidating fetches in flight (a fetched list differs from the published one)."""
        if upstream not in self._closed:
            self._closed[upstream] = asyncio.Event()

    def published(self, fetched_at: Mapping[str, int]) -> list[str]:
        """A view built from lists fetched at these generations is live: open the gates it covers."""
        opened = []
        for upstream in list(self._closed):
            if fetched_at.get(upstream, -1) >= self.generation(upstream):
                self._closed.pop(upstream).set()
                opened.append(upstream)
        return opened

    def unreachable(self, upstream: str, reason: str) -> None:
        """``upstream`` cannot answer (down, or its lists could not be fetched): a closed gate stays closed, but
        nobody waits on it any longer. Wakes the calls waiting now."""
        self._unreachable[upstream] = reason
        event = self._closed.get(upstream)
        if event is not None:
            # Waiters wake, find the gate still closed and the upstream unreachable, and give up; the gate stays
            # closed on a fresh event.
            self._closed[upstream] = asyncio.Event()
            event.set()

    def reachable(self, upstream: str) -> None:
        """``upstream`` answered again: calls wait for a closed gate as usual."""
        self._unreachable.pop(upstream, None)

    def unreachable_reason(self, upstream: str) -> str | None:
        """Why ``upstream`` cannot answer, or None when it is not known to be unreachable."""
        return self._unreachable.get(upstream)

    def is_closed(self, upstream: str) -> bool:
        return upstream in self._closed

    def closed(self) -> list[str]:
        return sorted(self._closed)

    async def wait_open(self, upstream: str, timeout_s: float) -> bool:
        """Wait until ``upstream``'s gate is open (or was never closed); False when ``timeout_s`` passed first, or
        at once when the gate is closed and the upstream unreachable (``unreachable_reason`` says why).

        Loops because a gate can close again right after opening (a second announcement): the caller wants an
        open gate, not merely the end of one closed period.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (event := self._closed.get(upstream)) is not None:
            if upstream in self._unreachable:
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                return False
        return True


class RefreshRequests:
    """Upstreams whose lists should be fetched again, and the wake-up of the refresher that fetches them."""

    def __init__(self, gate: RefreshGate | None = None) -> None:
        self.gate = gate or RefreshGate()
        self._dirty: set[str] = set()
        self._republish = False
        self._wake = asyncio.Event()

    def mark_dirty(self, upstream: str, *, gate: bool = True) -> None:
        """Re-fetch ``upstream``'s lists soon. With ``gate``, its tools are not called until the result is
        published."""
        if gate:
            self.gate.announce(upstream)
        self._dirty.add(upstream)
        self._wake.set()

    def republish_soon(self) -> None:
        """Rebuild the view from the lists already fetched (a pin approval changed what is quarantined)."""
        self._republish = True
        self._wake.set()

    def retry(self, upstream: str, after_s: float) -> None:
        """Fetch ``upstream`` again with the next refresh, and wake the refresher ``after_s`` from now."""
        self._dirty.add(upstream)
        asyncio.get_running_loop().call_later(after_s, self._wake.set)

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait for a request; False when ``timeout_s`` passed first (time for a periodic refresh)."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the refresher's cancellation (gh-86296).
        try:
            async with asyncio.timeout(timeout_s):
                await self._wake.wait()
        except TimeoutError:
            return False
        return True

    def take(self, also: Iterable[str] = ()) -> set[str]:
        """The upstreams asked for so far (plus ``also``); requests from now on wake the refresher again."""
        self._wake.clear()
        dirty, self._dirty = self._dirty | set(also), set()
        return dirty

    def take_republish(self) -> bool:
        """Whether a republish was asked for since the last call (asking again from now on counts anew)."""
        republish, self._republish = self._republish, False
        return republish
