"""Trust on first use, as a pure function: stored pins + the tools an upstream lists now -> what to do.

Per listed tool:

==========  =================================================  ==========================================
decision    when                                               effect
==========  =================================================  ==========================================
new         no pin yet                                         pinned, approved (trust on first use)
unchanged   same fingerprint as the approved pin               nothing
restored    approved fingerprint again while quarantined       candidate dropped, approved again
changed     fingerprint differs from the approved pin          quarantined with the new candidate; on a
                                                               trusted upstream approved at once instead
duplicate   the upstream lists the name twice, differently     quarantined (which one would a call reach?)
removed     pinned, but not listed now                         nothing: the pin stays, so a tool cannot be
                                                               dropped and re-added to get a fresh pin
==========  =================================================  ==========================================

A quarantined tool whose candidate is listed again (rejected or not) stays quarantined without a new event; a
different candidate replaces it and is audited as new drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from bastion.pinning.fingerprint import diff, fingerprint, pinned_view
from bastion.pinning.model import BY_FIRST_USE, BY_TRUSTED_UPSTREAM, Candidate, Pin, PinEvent

Decision = Literal["new", "unchanged", "restored", "changed", "duplicate", "removed"]


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The outcome of ``decide``: per-tool decisions, the pins to write, the events to audit, what to hide."""

    decisions: Mapping[str, Decision]
    writes: Mapping[str, Pin]
    events: tuple[PinEvent, ...]
    quarantined: frozenset[str]


def decide(pins: Mapping[str, Pin], tools: Sequence[Mapping[str, Any]], *, upstream: str, trusted: bool,
           now: str) -> Reconciliation:
    """Decide every listed tool against the stored ``pins`` of ``upstream``. ``now`` is an ISO 8601 timestamp."""
    listed: dict[str, list[Mapping[str, Any]]] = {}
    for tool in tools:
        name = tool.get("name")
        # A tool without a name cannot be called, so there is nothing to pin; the catalogue drops it.
        if isinstance(name, str):
            listed.setdefault(name, []).append(tool)

    decisions: dict[str, Decision] = {}
    writes: dict[str, Pin] = {}
    events: list[PinEvent] = []
    quarantined: set[str] = set()
    for name, definitions in listed.items():
        fps = {fingerprint(d) for d in definitions}
        if len(fps) > 1:
            decisions[name] = "duplicate"
            quarantined.add(name)
            continue
        decision, pin, event = _decide_one(pins.get(name), definitions[0], fps.pop(), upstream=upstream,
                                           trusted=trusted, now=now)
        decisions[name] = decision
        if pin is not None:
            writes[name] = pin
        if event is not None:
            events.append(event)
        current = pin if pin is not None else pins.get(name)
        if current is not None and current.status == "quarantined":
            quarantined.add(name)
    for name in pins.keys() - listed.keys():
        decisions[name] = "removed"
    return Reconciliation(decisions=decisions, writes=writes, events=tuple(events),
                          quarantined=frozenset(quarantined))


def _decide_one(pin: Pin | None, definition: Mapping[str, Any], fp: str, *, upstream: str, trusted: bool,
                now: str) -> tuple[Decision, Pin | None, PinEvent | None]:
    name = str(definition["name"])
    if pin is None:
        new_pin = Pin(tool=name, fingerprint=fp, definition=pinned_view(definition), status="approved",
                      first_seen=now, approved_by=BY_FIRST_USE, approved_at=now)
        return "new", new_pin, PinEvent("pin.new", "pinned", upstream, name, fp)
    if fp == pin.fingerprint:
        if pin.candidate is None:
            return "unchanged", None, None
        restored = replace(pin, status="approved", candidate=None)
        event = PinEvent("pin.restored", "restored", upstream, name, fp, old_fingerprint=pin.candidate.fingerprint)
        return "restored", restored, event
    lines = tuple(diff(pin.definition, definition))
    if trusted:
        approved = replace(pin, fingerprint=fp, definition=pinned_view(definition), status="approved",
                           approved_by=BY_TRUSTED_UPSTREAM, approved_at=now, candidate=None)
        event = PinEvent("pin.drift", "auto_approved", upstream, name, fp, old_fingerprint=pin.fingerprint,
                         diff=lines)
        return "changed", approved, event
    if pin.candidate is not None and pin.candidate.fingerprint == fp:
        return "changed", None, None
    candidate = Candidate(fingerprint=fp, definition=pinned_view(definition), first_seen=now)
    event = PinEvent("pin.drift", "quarantined", upstream, name, fp, old_fingerprint=pin.fingerprint, diff=lines)
    return "changed", replace(pin, status="quarantined", candidate=candidate), event


def approve(pin: Pin, *, by: str, now: str) -> Pin:
    """The candidate becomes the approved definition. The caller checks that there is one."""
    assert pin.candidate is not None
    return replace(pin, fingerprint=pin.candidate.fingerprint, definition=pin.candidate.definition,
                   status="approved", approved_by=by, approved_at=now, candidate=None)


def reject(pin: Pin, *, by: str, now: str) -> Pin:
    """The candidate is marked rejected and the tool stays quarantined until the upstream changes it again."""
    assert pin.candidate is not None
    return replace(pin, candidate=replace(pin.candidate, rejected_by=by, rejected_at=now))


def unverified(pins: Mapping[str, Pin], tools: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The listed tools that ``pins`` do not vouch for: no approved pin with exactly this fingerprint (new,
    changed, quarantined, or listed twice differently). Used when the store cannot be reached: only what was
    verified before stays callable (fail static), and nothing is written or approved."""
    fingerprints: dict[str, set[str]] = {}
    for tool in tools:
        name = tool.get("name")
        if isinstance(name, str):
            fingerprints.setdefault(name, set()).add(fingerprint(tool))
    out = set()
    for name, fps in fingerprints.items():
        pin = pins.get(name)
        if len(fps) > 1 or pin is None or pin.status != "approved" or pin.fingerprint not in fps:
            out.add(name)
    return frozenset(out)
