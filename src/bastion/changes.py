"""The change feed: what this replica's front door must pass on to its clients, told by the core.

Two kinds of news, both produced below the HTTP layer and delivered by it: the catalogue changed (clients get
``notifications/*/list_changed``, announced by ``ViewPublisher``) and an upstream resource was updated
(subscribed modern listeners get it, relayed by ``UpstreamBroadcast``). The feed is built first and handed to
both sides, so the producers never hold the front door and the front door subscribes in its own constructor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

# The catalogue view: a parameter, since the view module builds on this one.
V = TypeVar("V")
# Told which lists changed (``tools``, ``prompts``, ``resources``), between which two views: the one replaced and
# the one in force. Both come from the publisher, which swaps them, so a listener never works out a change against
# a view it kept itself (the first build is not announced, and a kept view would miss it).
CatalogueListener = Callable[[list[str], V, V], Awaitable[None]]
# Told (public URI, cleaned notification params) of every upstream resource update.
ResourceListener = Callable[[str, Mapping[str, Any]], None]


class ChangeFeed(Generic[V]):
    def __init__(self) -> None:
        self._catalogue: list[CatalogueListener[V]] = []
        self._resources: list[ResourceListener] = []

    def subscribe(self, catalogue: CatalogueListener[V], resources: ResourceListener | None = None) -> None:
        self._catalogue.append(catalogue)
        if resources is not None:
            self._resources.append(resources)

    async def catalogue_changed(self, changed: list[str], old: V, new: V) -> None:
        for listener in self._catalogue:
            await listener(changed, old, new)

    def resource_updated(self, uri: str, params: Mapping[str, Any]) -> None:
        for listener in self._resources:
            listener(uri, params)
