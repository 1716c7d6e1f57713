"""Pins, candidates and pin events: plain frozen data, with the JSON shape both stores share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PinStatus = Literal["approved", "quarantined"]
EventKind = Literal["pin.new", "pin.drift", "pin.restored", "pin.approved", "pin.rejected"]
EventAction = Literal["pinned", "quarantined", "auto_approved", "restored", "approved", "rejected"]

# Who approved a pin that no admin approved: the first definition seen, or a change on a trusted upstream.
BY_FIRST_USE = "trust-on-first-use"
BY_TRUSTED_UPSTREAM = "trusted-upstream"


class PinDataError(ValueError):
    """A stored pin does not have the expected shape (the store maps this to a bastion error)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A changed definition waiting for an admin. ``rejected_*`` are set once an admin rejected it."""

    fingerprint: str
    definition: Mapping[str, Any]
    first_seen: str
    rejected_by: str | None = None
    rejected_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fingerprint": self.fingerprint, "definition": dict(self.definition),
                               "first_seen": self.first_seen}
        if self.rejected_by is not None:
            out["rejected_by"] = self.rejected_by
            out["rejected_at"] = self.rejected_at
        return out

    @classmethod
    def from_json(cls, data: Any) -> Candidate:
        obj = _object(data, "candidate")
        return cls(fingerprint=_str(obj, "fingerprint"), definition=_definition(obj),
                   first_seen=_str(obj, "first_seen"), rejected_by=_opt_str(obj, "rejected_by"),
                   rejected_at=_opt_str(obj, "rejected_at"))


@dataclass(frozen=True, slots=True)
class Pin:
    """The approved definition of one upstream tool, and the pending change if there is one.

    ``status`` is ``quarantined`` exactly when ``candidate`` is set: the tool is hidden until an admin approves the
    candidate, or the upstream goes back to the approved definition.
    """

    tool: str
    fingerprint: str
    definition: Mapping[str, Any]
    status: PinStatus
    first_seen: str
    approved_by: str
    approved_at: str
    candidate: Candidate | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fingerprint": self.fingerprint, "definition": dict(self.definition),
                               "status": self.status, "first_seen": self.first_seen,
                               "approved_by": self.approved_by, "approved_at": self.approved_at}
        if self.candidate is not None:
            out["candidate"] = self.candidate.to_json()
        return out

    @classmethod
    def from_json(cls, tool: str, data: Any) -> Pin:
        obj = _object(data, f"pin {tool!r}")
        status = obj.get("status")
        if status not in ("approved", "quarantined"):
            raise PinDataError(f"pin {tool!r}: status must be 'approved' or 'quarantined'")
        raw_candidate = obj.get("candidate")
        return cls(tool=tool, fingerprint=_str(obj, "fingerprint"), definition=_definition(obj),
                   status=status, first_seen=_str(obj, "first_seen"), approved_by=_str(obj, "approved_by"),
                   approved_at=_str(obj, "approved_at"),
                   candidate=None if raw_candidate is None else Candidate.from_json(raw_candidate))


@dataclass(frozen=True, slots=True)
class PinEvent:
    """Something that happened to a pin, for the audit log and the operator log."""

    event: EventKind
    action: EventAction
    upstream: str
    tool: str
    new_fingerprint: str
    old_fingerprint: str | None = None
    diff: tuple[str, ...] = ()
    by: str | None = None

    def to_log(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": self.event, "action": self.action, "upstream": self.upstream,
                               "tool": self.tool, "new_fingerprint": self.new_fingerprint}
        if self.old_fingerprint is not None:
            out["old_fingerprint"] = self.old_fingerprint
        if self.diff:
            out["diff"] = list(self.diff)
        if self.by is not None:
            out["by"] = self.by
        return out


@dataclass(frozen=True, slots=True)
class PinnedTool:
    """A pin together with the upstream it belongs to, as listed to admins."""

    upstream: str
    pin: Pin


def _object(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise PinDataError(f"{what}: expected an object")
    return data


def _str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise PinDataError(f"{key}: expected a string")
    return value


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise PinDataError(f"{key}: expected a string")
    return value


def _definition(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("definition")
    if not isinstance(value, Mapping):
        raise PinDataError("definition: expected an object")
    return value
