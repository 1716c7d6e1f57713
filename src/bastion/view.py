"""The published catalogue view: what every request reads, and how a new one is built and swapped in.

A ``View`` is one catalogue version with everything derived from it (quarantine map, compiled validators,
instructions, hidden upstreams), immutable and swapped whole. ``ViewPublisher`` owns the current one: the pool
hands it every upstream's lists after a refresh, it merges them, runs the view steps the assembly gave it (in
that order, each receiving the previous view), swaps the result in and tells the change feed what clients should
re-list. Request handlers read ``publisher.view`` once per request, so a refresh in the middle of a request never
mixes two catalogue versions.

Built before the pool, the guards and the gateway, which all read it: nothing here needs them back.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from bastion import catalogue as cat
from bastion.changes import ChangeFeed
from bastion.upstream.base import Upstream

# The logger the gateway always published under: log pipelines filter on it.
log = structlog.get_logger("bastion.gateway")


@dataclass(frozen=True, slots=True)
class View:
    """One catalogue version with everything derived from it, swapped whole."""

    catalogue: cat.Catalogue = field(default_factory=cat.Catalogue)
    # Tools hidden from lists and refused on call whatever the policy says (hostile schema, changed pin…),
    # with the reason for the log and the audit record.
    quarantined: Mapping[str, str] = field(default_factory=dict)
    # Per-tool objects derived once per version (compiled validators), keyed by public name.
    derived: Mapping[str, Any] = field(default_factory=dict)
    instructions: str | None = None
    # Each upstream's own instructions, as sent: what ``instructions`` is joined from (a view step may rewrite
    # ``instructions`` from these, e.g. the sanitizer, which judges each upstream under its own policy).
    upstream_instructions: tuple[tuple[str, str], ...] = ()
    # Upstreams down past the health grace (``health.hide_after``): their tools leave the lists (calls to them
    # still resolve and fail fast with -31002, so a client holding an old list gets the true reason).
    unavailable: frozenset[str] = frozenset()


# Turns a freshly merged catalogue into a view; feature packages contribute steps (schema compilation in
# ``validation``, definition cleaning in ``sanitize``, pins in ``pinning``, the drop record in ``audit``).
# Steps run in order, each receiving the previous view.
ViewStep = Callable[[View, Mapping[str, cat.UpstreamLists]], Awaitable[View]]


class ViewPublisher:
    """Owns the current view: rebuilds it from the upstreams' lists, hides unavailable upstreams, announces."""

    def __init__(self, upstreams: Sequence[Upstream], steps: Sequence[ViewStep], changes: ChangeFeed, *,
                 separator: str = "__", on_collision: Literal["first", "reject"] = "first") -> None:
        self._separator = separator
        self._on_collision = on_collision
        # Read for their instructions at each rebuild (an upstream's ``info`` is set once it is connected).
        self._upstreams = tuple(upstreams)
        self._steps = tuple(steps)
        self._changes = changes
        self._lock = asyncio.Lock()
        self.view = View()

    async def rebuild(self, lists: Mapping[str, cat.UpstreamLists]) -> None:
        """Merge the upstreams' lists into a new view, swap it in, and announce what changed."""
        async with self._lock:
            # In a worker thread: merging tens of thousands of tools is pure CPU, and the loop must keep serving
            # other clients' calls meanwhile (the GIL hands it back every few milliseconds).
            merged = await asyncio.to_thread(cat.build, list(lists.values()), separator=self._separator,
                                             on_collision=self._on_collision)
            upstream_instructions = self._upstream_instructions()
            view = View(catalogue=merged, instructions=join_instructions(upstream_instructions),
                        upstream_instructions=upstream_instructions, unavailable=self.view.unavailable)
            for step in self._steps:
                view = await step(view, lists)
            old, self.view = self.view, view
            changed = changes(old, view)
            log.info("catalogue.published", version=view.catalogue.version, tools=len(view.catalogue.tools),
                     quarantined=len(view.quarantined), changed=changed or None)
        if changed and old.catalogue.version != "":
            await self._changes.catalogue_changed(changed)

    async def set_unavailable(self, upstreams: frozenset[str]) -> None:
        """Hide (or show again) the tools of upstreams the health monitor holds down, and announce it."""
        async with self._lock:
            old = self.view
            if old.unavailable == upstreams:
                return
            self.view = dataclasses.replace(old, unavailable=upstreams)
            changed = changes(old, self.view)
            log.info("catalogue.availability", unavailable=sorted(upstreams), changed=changed or None)
        if changed and old.catalogue.version != "":
            await self._changes.catalogue_changed(changed)

    def _upstream_instructions(self) -> tuple[tuple[str, str], ...]:
        parts = []
        for upstream in self._upstreams:
            info = upstream.info
            if info is not None and info.instructions:
                parts.append((upstream.name, info.instructions))
        return tuple(parts)


def join_instructions(parts: Sequence[tuple[str, str]]) -> str | None:
    """What clients get as ``instructions``: each upstream's, labelled with its name."""
    return "\n\n".join(f"[{name}] {text}" for name, text in parts) or None


def changes(old: View, new: View) -> list[str]:
    """What a client must list again between two views (``tools``, ``prompts``, ``resources``)."""
    changed = []
    if [t.definition for t in old.catalogue.tools if t.public_name not in old.quarantined
        and t.upstream not in old.unavailable] != \
            [t.definition for t in new.catalogue.tools if t.public_name not in new.quarantined
             and t.upstream not in new.unavailable]:
        changed.append("tools")
    if [p.definition for p in old.catalogue.prompts] != [p.definition for p in new.catalogue.prompts]:
        changed.append("prompts")
    if (old.catalogue.resources, old.catalogue.templates) != (new.catalogue.resources, new.catalogue.templates):
        changed.append("resources")
    return changed
