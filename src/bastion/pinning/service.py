"""Pinning as the gateway and the admin CLI use it: reconcile listings, approve, reject, list, diff.

``reconcile`` never raises for a store failure. It fails static: a tool whose definition matches the approved pin
last read from (or written to) the store stays callable, and only what cannot be verified against those pins (new or
changed tools, or every tool of an upstream whose pins were never read) is quarantined. The outcome says
``degraded`` so the core can refresh again soon.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

import structlog

from bastion.pinning import decide as rules
from bastion.pinning.config import PinningConfig
from bastion.pinning.errors import CandidateMismatch, NothingPending, PinNotFound, PinStoreUnavailable
from bastion.pinning.fingerprint import diff as diff_definitions
from bastion.pinning.model import Pin, PinEvent, PinnedTool, PinStatus
from bastion.pinning.store import PinStore

log = structlog.get_logger("bastion.pinning")

# Tool names a ``pin.pinned`` line lists (the first ones by name); ``count`` has them all.
_PINNED_NAMES = 20


@dataclass(frozen=True, slots=True)
class PinOutcome:
    """What the core does after a refresh: hide ``quarantined``, audit ``events``; retry soon when ``degraded``."""

    upstream: str
    quarantined: frozenset[str]
    events: tuple[PinEvent, ...] = ()
    decisions: Mapping[str, rules.Decision] | None = None
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class _Change:
    """One admin change, in the shape ``PinStore.update`` expects."""

    writes: Mapping[str, Pin]
    pin: Pin


def _utc_now() -> datetime:
    return datetime.now(UTC)


StoreState = Literal["ok", "static", "closed"]


class Pinning:
    """``on_store`` hears how each reconcile met the store: ``ok``, or unavailable with the last verified pins
    kept (``static``) or none to keep (``closed``). Must not block or raise."""

    def __init__(self, store: PinStore, cfg: PinningConfig, *, clock: Callable[[], datetime] = _utc_now,
                 on_store: Callable[[StoreState], None] | None = None) -> None:
        self.store = store
        self.cfg = cfg
        self._clock = clock
        self._on_store = on_store
        # Per upstream, the pins as the store last held them after a reconcile: what fail-static trusts.
        self._verified: dict[str, dict[str, Pin]] = {}

    def _now(self) -> str:
        return self._clock().astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

    async def reconcile(self, upstream: str, tools: Sequence[Mapping[str, Any]]) -> PinOutcome:
        """Check the tools ``upstream`` lists now (as it sent them) against their pins."""
        if not self.cfg.enabled:
            return PinOutcome(upstream=upstream, quarantined=frozenset())
        trusted = self.cfg.is_trusted(upstream)
        now = self._now()
        read: dict[str, Pin] = {}
        lost: dict[str, Pin] = {}

        def plan(pins: Mapping[str, Pin]) -> rules.Reconciliation:
            # bastion never deletes a pin, so one this replica verified and the store no longer holds was lost
            # (Redis restarted without persistence or flushed, the pins file replaced): decided as a first use,
            # a quarantined rug pull would be pinned as trusted. It is written back and decided on instead.
            lost.clear()
            lost.update((tool, pin) for tool, pin in self._verified.get(upstream, {}).items() if tool not in pins)
            read.clear()
            read.update(pins)
            read.update(lost)
            decided = rules.decide(read, tools, upstream=upstream, trusted=trusted, now=now)
            return replace(decided, writes={**lost, **decided.writes}) if lost else decided

        try:
            result = await self.store.update(upstream, plan)
        except PinStoreUnavailable as exc:
            return self._fail_static(upstream, tools, exc)
        self._verified[upstream] = {**read, **result.writes}
        self._store_state("ok")
        if lost:
            log.error("pin.store_lost", upstream=upstream, restored=len(lost), tools=sorted(lost)[:_PINNED_NAMES],
                      detail="the pin store no longer held pins this gateway had verified (Redis restarted empty "
                             "or flushed, the pins file replaced); they were written back, and the tools decided "
                             "against them, not trusted anew")
        pinned = [event.tool for event in result.events if event.event == "pin.new"]
        if pinned:
            # One line per upstream at info, each tool at debug: a first start pins every tool of every upstream,
            # and thousands of identical info lines there would cost more CPU than pinning them (and say less).
            log.info("pin.pinned", upstream=upstream, count=len(pinned), tools=sorted(pinned)[:_PINNED_NAMES])
        # Asked of the stdlib logger the renderer sits behind (structlog's own answer depends on its configuration).
        debug = logging.getLogger("bastion.pinning").isEnabledFor(logging.DEBUG)
        for event in result.events:
            if event.event != "pin.new":
                log.warning(event.event, **{k: v for k, v in event.to_log().items() if k != "event"})
            elif debug:
                log.debug(event.event, **{k: v for k, v in event.to_log().items() if k != "event"})
        return PinOutcome(upstream=upstream, quarantined=result.quarantined, events=result.events,
                          decisions=result.decisions)

    def _fail_static(self, upstream: str, tools: Sequence[Mapping[str, Any]],
                     exc: PinStoreUnavailable) -> PinOutcome:
        """The store is unreachable: keep serving what the last verified pins vouch for, hide the rest. Without
        any verified pins for this upstream (the store was down since start), everything is hidden."""
        listed = frozenset(t["name"] for t in tools if isinstance(t.get("name"), str))
        last = self._verified.get(upstream)
        quarantined = listed if last is None else rules.unverified(last, tools)
        mode: StoreState = "closed" if last is None else "static"
        log.error("pin.unavailable", upstream=upstream, mode=mode, served=len(listed - quarantined),
                  quarantined=len(quarantined), detail=str(exc),
                  behaviour="tools matching their last verified pin stay callable; new or changed tools are "
                            "hidden until the pin store answers" if mode == "static" else
                            "no verified pins yet for this upstream: its tools are hidden until the store answers")
        self._store_state(mode)
        return PinOutcome(upstream=upstream, quarantined=quarantined, degraded=True)

    def _store_state(self, state: StoreState) -> None:
        if self._on_store is not None:
            self._on_store(state)

    async def approve(self, upstream: str, tool: str, by: str, *, fingerprint: str | None = None) -> PinEvent:
        """Approve the pending change. ``fingerprint``, when given, must be the candidate the admin reviewed."""
        now = self._now()

        def plan(pins: Mapping[str, Pin]) -> _Change:
            pin = self._pending(pins, upstream, tool, fingerprint)
            new = rules.approve(pin, by=by, now=now)
            return _Change(writes={tool: new}, pin=pin)

        old = (await self.store.update(upstream, plan)).pin
        await self._announce(upstream)
        assert old.candidate is not None
        event = PinEvent("pin.approved", "approved", upstream, tool, old.candidate.fingerprint,
                         old_fingerprint=old.fingerprint, diff=tuple(diff_definitions(old.definition,
                                                                                      old.candidate.definition)),
                         by=by)
        log.warning(event.event, **{k: v for k, v in event.to_log().items() if k != "event"})
        return event

    async def reject(self, upstream: str, tool: str, by: str, *, fingerprint: str | None = None) -> PinEvent:
        """Reject the pending change: the tool stays quarantined until the upstream changes it again."""
        now = self._now()

        def plan(pins: Mapping[str, Pin]) -> _Change:
            pin = self._pending(pins, upstream, tool, fingerprint)
            return _Change(writes={tool: rules.reject(pin, by=by, now=now)}, pin=pin)

        old = (await self.store.update(upstream, plan)).pin
        await self._announce(upstream)
        assert old.candidate is not None
        event = PinEvent("pin.rejected", "rejected", upstream, tool, old.candidate.fingerprint,
                         old_fingerprint=old.fingerprint, by=by)
        log.warning(event.event, **{k: v for k, v in event.to_log().items() if k != "event"})
        return event

    async def _announce(self, upstream: str) -> None:
        """Running gateways apply a decision as soon as they hear of it; a lost announcement only delays it to
        their next periodic refresh, so the decision (already stored) stands."""
        try:
            await self.store.announce(upstream)
        except PinStoreUnavailable as exc:
            log.warning("pin.announce_failed", upstream=upstream, detail=str(exc))

    async def list(self, upstream: str | None = None, *, status: PinStatus | None = None) -> list[PinnedTool]:
        """Pins sorted by upstream and tool, optionally of one upstream and one status."""
        if upstream is None:
            by_upstream = await self.store.load_all()
        else:
            by_upstream = {upstream: await self.store.load(upstream)}
        return [PinnedTool(up, pin) for up in sorted(by_upstream) for _, pin in sorted(by_upstream[up].items())
                if status is None or pin.status == status]

    async def get(self, upstream: str, tool: str) -> Pin:
        pin = (await self.store.load(upstream)).get(tool)
        if pin is None:
            raise PinNotFound(upstream, tool)
        return pin

    async def diff(self, upstream: str, tool: str) -> builtins.list[str]:
        """The approved definition against the pending one, field by field."""
        pin = await self.get(upstream, tool)
        if pin.candidate is None:
            raise NothingPending(upstream, tool)
        return diff_definitions(pin.definition, pin.candidate.definition)

    @staticmethod
    def _pending(pins: Mapping[str, Pin], upstream: str, tool: str, fingerprint: str | None) -> Pin:
        pin = pins.get(tool)
        if pin is None:
            raise PinNotFound(upstream, tool)
        if pin.candidate is None:
            raise NothingPending(upstream, tool)
        if fingerprint is not None and not pin.candidate.fingerprint.startswith(fingerprint):
            raise CandidateMismatch(upstream, tool, fingerprint, pin.candidate.fingerprint)
        return pin
