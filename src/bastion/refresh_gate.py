"""Per-upstream gates that keep calls off a definition nobody has checked yet.

An upstream's gate closes the moment its tool definitions may have changed (it announced ``list_changed``, or a
fetched list differs from the published one) and opens again only when a view built from lists fetched *after*
that moment is published, so the new definitions have passed pinning, schema compilation and sanitizing. A call
to the upstream's tools in between waits for the gate (bounded) instead of reaching the upstream on the old
definition.

Generations make "fetched after that moment" exact: every announcement bumps the upstream's generation; a fetch
remembers the generation it started at; a publish opens only the gates whose generation it covers. An
announcement that lands while a fetch is in flight therefore keeps the gate closed until the next fetch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping


class RefreshGate:
    def __init__(self) -> None:
        self._closed: dict[str, asyncio.Event] = {}
        self._generation: dict[str, int] = {}

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

    def is_closed(self, upstream: str) -> bool:
        return upstream in self._closed

    def closed(self) -> list[str]:
        return sorted(self._closed)

    async def wait_open(self, upstream: str, timeout_s: float) -> bool:
        """Wait until ``upstream``'s gate is open (or was never closed); False when ``timeout_s`` passed first.

        Loops because a gate can close again right after opening (a second announcement): the caller wants an
        open gate, not merely the end of one closed period.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (event := self._closed.get(upstream)) is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                return False
        return True
