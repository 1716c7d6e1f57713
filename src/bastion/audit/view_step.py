"""The audit view step: the last step of every catalogue rebuild, recording what clients do not get.

Runs after every other step (``bastion.view``), so it sees every drop the catalogue build and those steps
recorded and every tool they quarantined, and writes one ``catalogue.drop`` record per item when its drop first
appears or its reason changes.
"""

from __future__ import annotations

from collections.abc import Mapping

from bastion.audit.events import AuditEvents
from bastion.catalogue import UpstreamLists
from bastion.view import View


class AuditCatalogueDrops:
    """Last view step: one ``catalogue.drop`` record per item clients do not get as its upstream offered it.

    Covers every drop the catalogue and the steps before this one recorded (invalid or colliding names, blocked
    definitions, limits) and every quarantined tool (hostile schema, changed pinned definition, blocked
    definition), each when it first appears or its reason changes: the memory is the previous view's drops.
    """

    def __init__(self, events: AuditEvents) -> None:
        self._events = events
        self._seen: dict[tuple[str, str, str, str], str] = {}

    async def __call__(self, view: View, lists: Mapping[str, UpstreamLists]) -> View:
        # (kind, upstream, item, action) -> reason: an item both dropped once and quarantined gets both records.
        current: dict[tuple[str, str, str, str], str] = {}
        for drop in view.catalogue.dropped:
            current[(drop.kind, drop.upstream, drop.name, "dropped")] = drop.reason
        for public, reason in view.quarantined.items():
            entry = view.catalogue.tool(public)
            upstream, name = (entry.upstream, entry.original_name) if entry is not None else ("", public)
            current[("tool", upstream, name, "quarantined")] = reason
        for key, reason in current.items():
            if self._seen.get(key) != reason:
                kind, upstream, item, action = key
                await self._events.catalogue_drop(upstream=upstream, item_kind=kind, item=item, reason=reason,
                                                  action=action)
        self._seen = current
        return view
