"""The change feed: what this replica's front door must pass on to its clients, told by the core.

Two kinds of news, both produced below the HTTP layer and delivered by it: the catalogue changed (clients get
``notifications/*/list_changed``, announced by ``ViewPublisher``) and an upstream resource was updated
(subscribed modern listeners get it, relayed by ``UpstreamBroadcast``). The feed is built first and handed to
both sides, so the producers never hold the front door and the front door subscribes in its own constructor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

# Told which lists changed (``tools``, ``prompts``, ``resources``).
CatalogueListener = Callable[[list[str]], Awaitable[None]]
# Told (public URI, cleaned notification params) of every upstream resource update.
ResourceListener = Callable[[str, Mapping[str, Any]], None]


class ChangeFeed:
    def __init__(self) -> None:
        self._catalogue: list[CatalogueListener] = []
        self._resources: list[ResourceListener] = []

    def subscribe(self, catalogue: CatalogueListener, resources: ResourceListener | None = None) -> None:
        self._catalogue.append(catalogue)
        if resources is not None:
            self._resources.append(resources)

    async def catalogue_changed(self, changed: list[str]) -> None:
        for listener in self._catalogue:
            await listener(changed)

    def resource_updated(self, uri: str, params: Mapping[str, Any]) -> None:
        for listener in self._resources:
            listener(uri, params)
