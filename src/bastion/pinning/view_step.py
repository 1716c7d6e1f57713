"""The pinning step: tools whose definition changed since it was pinned are quarantined until approved.

A view step (``bastion.view``), run on every catalogue refresh: ``Pinning.reconcile`` compares each upstream's
tools, as the upstream sent them, with their pins; changed ones enter the view's quarantine map (which
``QuarantineGuard`` and the lists enforce) and drift goes to the audit log. When the pin store cannot be read,
the upstream's tools are hidden as unverifiable and ``PinRecheck`` asks for another look within seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace

from bastion.audit.events import AuditEvents
from bastion.catalogue import UpstreamLists
from bastion.pinning.decide import Decision
from bastion.pinning.service import Pinning, PinOutcome
from bastion.refresh_gate import RefreshRequests
from bastion.view import View

# After a refresh that could not reach the pin store, that upstream is re-checked this soon (not at the next
# periodic refresh, a minute later): tools hidden as unverifiable come back within seconds of the store answering.
PIN_RECHECK_S = 2.0


class PinTools:
    """Trust on first use: quarantine any tool whose definition changed since it was pinned, until approved.

    Fingerprints cover the definition as the upstream sent it, so a change is caught whether it was announced
    with ``list_changed`` or slipped into a routine refresh. Drift goes to the audit log.
    """

    def __init__(self, pinning: Pinning, events: AuditEvents,
                 on_degraded: Callable[[str], None] | None = None) -> None:
        self._pinning = pinning
        self._events = events
        # Told the upstream whose pins could not be checked, so the core re-checks soon instead of at the next
        # periodic refresh (a minute by default) after the store answers again.
        self._on_degraded = on_degraded

    async def __call__(self, view: View, lists: Mapping[str, UpstreamLists]) -> View:
        quarantined = dict(view.quarantined)
        by_original = {(t.upstream, t.original_name): t.public_name for t in view.catalogue.tools}
        for name, up in lists.items():
            outcome = await self._pinning.reconcile(name, [dict(t) for t in up.tools])
            if outcome.degraded and self._on_degraded is not None:
                self._on_degraded(name)
            for tool in outcome.quarantined:
                public = by_original.get((name, tool))
                if public is not None:
                    quarantined[public] = quarantine_reason(outcome, tool)
            # The pinning service logs every event itself; drift also belongs in the audit log.
            for event in outcome.events:
                if event.event == "pin.drift":
                    await self._events.pin_drift(
                        upstream=event.upstream, tool=event.tool, pinned=event.old_fingerprint or "",
                        observed=event.new_fingerprint,
                        action="blocked" if event.action == "quarantined" else "warned")
        return replace(view, quarantined=quarantined)


# Why a decision quarantines a tool, in the words its callers and its audit records get. Every quarantining
# decision has its own: a reason that names another decision sends an operator looking for what is not there.
_REASONS: dict[Decision, str] = {
    "duplicate": "the upstream lists this tool more than once, with different definitions",
}
_CHANGED = "definition changed since it was pinned; awaiting approval"


def quarantine_reason(outcome: PinOutcome, tool: str) -> str:
    if outcome.degraded:
        return "pin store unavailable; definition not verified"
    decisions = outcome.decisions or {}
    return _REASONS.get(decisions[tool], _CHANGED) if tool in decisions else _CHANGED


class PinRecheck:
    """``PinTools``' ``on_degraded``: re-fetch an upstream whose pins could not be checked, ``delay_s`` later.

    One re-check per upstream at a time; each failed re-check schedules the next (its refresh is degraded again).
    """

    def __init__(self, requests: RefreshRequests, delay_s: float = PIN_RECHECK_S) -> None:
        self._requests = requests
        self._delay_s = delay_s
        self._scheduled: set[str] = set()

    def __call__(self, upstream: str) -> None:
        if upstream in self._scheduled:
            return
        self._scheduled.add(upstream)

        def fire() -> None:
            self._scheduled.discard(upstream)
            self._requests.mark_dirty(upstream)

        asyncio.get_running_loop().call_later(self._delay_s, fire)
