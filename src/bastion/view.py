"""The published catalogue view: what every request reads, and how a new one is built and swapped in.

A ``View`` is one catalogue version with everything derived from it (quarantine map, compiled validators,
instructions, hidden upstreams), immutable and swapped whole. ``ViewPublisher`` owns the current one: the pool
hands it every upstream's lists after a refresh, it merges them, runs the view steps the assembly gave it (in
that order, each receiving the previous view), swaps the result in and tells the change feed what clients should
re-list. Request handlers read ``publisher.view`` once per request, so a refresh in the middle of a request never
mixes two catalogue versions.

Most refreshes find nothing new (the periodic one every minute, a pin approval): the leading steps marked
``Reusable`` depend on nothing but the lists, so when every upstream's lists equal the previous build's, their
result is taken from that build and only the steps after them (pinning, which reads its store, and the drop
audit) run again.

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
from bastion import collector
from bastion.changes import ChangeFeed
from bastion.upstream.base import Upstream

# The logger the gateway always published under: log pipelines filter on it.
log = structlog.get_logger("bastion.gateway")


# weakref_slot: the tests check that a replaced view is freed, not kept alive by anything here.
@dataclass(frozen=True, slots=True, weakref_slot=True)
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


@dataclass(frozen=True, slots=True)
class Reusable:
    """A view step whose result depends on nothing but the view it receives and the lists: no store, no clock, no
    state that can change between two builds (schema compilation, definition sanitizing; not pinning). When it
    leads the steps, a build from unchanged lists reuses its result (see ``ViewPublisher``)."""

    step: ViewStep

    async def __call__(self, view: View, lists: Mapping[str, cat.UpstreamLists]) -> View:
        return await self.step(view, lists)


@dataclass(frozen=True, slots=True)
class _Reused:
    """The input of the last build and the view its leading ``Reusable`` steps made of it."""

    lists: Mapping[str, cat.UpstreamLists]
    upstream_instructions: tuple[tuple[str, str], ...]
    view: View

    def matches(self, lists: Mapping[str, cat.UpstreamLists], upstream_instructions: tuple[tuple[str, str], ...],
                ) -> bool:
        # Identity first: the pool keeps the very object when a refresh fetched equal lists, so the usual case
        # costs no comparison of the definitions.
        return (self.upstream_instructions == upstream_instructions and list(self.lists) == list(lists)
                and all(old is new or old == new for old, new in zip(self.lists.values(), lists.values(),
                                                                      strict=True)))


class ViewPublisher:
    """Owns the current view: rebuilds it from the upstreams' lists, hides unavailable upstreams, announces."""

    def __init__(self, upstreams: Sequence[Upstream], steps: Sequence[ViewStep], changes: ChangeFeed[View], *,
                 separator: str = "__", on_collision: Literal["first", "reject"] = "first") -> None:
        self._separator = separator
        self._on_collision = on_collision
        # Read for their instructions at each rebuild (an upstream's ``info`` is set once it is connected).
        self._upstreams = tuple(upstreams)
        # The leading reusable steps, and the rest, which run on every build.
        lead = next((i for i, step in enumerate(steps) if not isinstance(step, Reusable)), len(steps))
        self._reusable, self._steps = tuple(steps[:lead]), tuple(steps[lead:])
        self._reused: _Reused | None = None
        self._changes = changes
        self._lock = asyncio.Lock()
        self.view = View()

    async def rebuild(self, lists: Mapping[str, cat.UpstreamLists]) -> None:
        """Merge the upstreams' lists into a new view, swap it in, and announce what changed."""
        async with self._lock:
            # No automatic garbage collection while building: see ``bastion.collector`` for why and what it saves.
            with collector.paused():
                upstream_instructions = self._upstream_instructions()
                reused = self._reused
                if reused is not None and reused.matches(lists, upstream_instructions):
                    view = dataclasses.replace(reused.view, unavailable=self.view.unavailable)
                else:
                    view = await self._derive(lists, upstream_instructions)
                for step in self._steps:
                    view = await step(view, lists)
            old, self.view = self.view, view
            changed = changes(old, view)
            log.info("catalogue.published", version=view.catalogue.version, tools=len(view.catalogue.tools),
                     quarantined=len(view.quarantined), changed=changed or None)
        if changed and old.catalogue.version != "":
            await self._changes.catalogue_changed(changed, old, view)

    async def _derive(self, lists: Mapping[str, cat.UpstreamLists],
                      upstream_instructions: tuple[tuple[str, str], ...]) -> View:
        """Merge the lists and run the reusable steps on the result; remember it for the next build."""
        # In a worker thread: merging tens of thousands of tools is pure CPU, and the loop must keep serving
        # other clients' calls meanwhile (the GIL hands it back every few milliseconds).
        merged = await asyncio.to_thread(cat.build, list(lists.values()), separator=self._separator,
                                         on_collision=self._on_collision)
        view = View(catalogue=merged, instructions=join_instructions(upstream_instructions),
                    upstream_instructions=upstream_instructions, unavailable=self.view.unavailable)
        for step in self._reusable:
            view = await step(view, lists)
        self._reused = _Reused(dict(lists), upstream_instructions, view)
        return view

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
            await self._changes.catalogue_changed(changed, old, self.view)

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
