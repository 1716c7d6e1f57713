"""Flow-aware policy, the pure part: labels on tools and the ``when:`` conditions that read a context's history.

A *label* (``private_data``, ``untrusted_content``, ``external_communication``, or any name an admin invents) is
given to tools by the same matchers rules use: tool globs, upstreams and annotations. A *touch* is one earlier
call of the caller's context that set a label (tool, time, audit ``call_id``). A rule's ``when: {touched: [...],
within: 30m, at_least: N}`` holds when, for every listed label, the history holds at least ``N`` touches of it
no older than ``within``. Nothing here does I/O: the history is an input (see ``bastion.flow`` for the store).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from bastion.call import CallContext
from bastion.policy.names import Glob

TouchedOn = Literal["any", "success", "result"]
TOUCHED_ON: tuple[TouchedOn, ...] = ("any", "success", "result")


@dataclass(frozen=True, slots=True)
class Touch:
    """One earlier call that set ``label`` in a context: the evidence a flow denial names."""

    label: str
    tool: str
    at: float  # epoch seconds
    call_id: str

    def as_json(self) -> dict[str, Any]:
        return {"label": self.label, "tool": self.tool, "at": self.at, "call_id": self.call_id}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Touch:
        return cls(str(raw["label"]), str(raw["tool"]), float(raw["at"]), str(raw["call_id"]))


@dataclass(frozen=True, slots=True)
class FlowHistory:
    """A context's touches (any order) and the time the decision is made at."""

    touches: tuple[Touch, ...]
    now: float


@dataclass(frozen=True, slots=True)
class FlowCondition:
    """``when:`` on a rule. ``within_s`` None: the whole retained history counts."""

    touched: tuple[str, ...]
    within_s: float | None = None
    at_least: int = 1

    def evidence(self, history: FlowHistory) -> tuple[Touch, ...] | None:
        """The touches that satisfy the condition (the newest ``at_least`` per label), or None if it does not
        hold."""
        since = None if self.within_s is None else history.now - self.within_s
        chain: list[Touch] = []
        for label in self.touched:
            found = sorted((t for t in history.touches
                            if t.label == label and (since is None or t.at >= since)), key=lambda t: t.at)
            if len(found) < self.at_least:
                return None
            chain.extend(found[-self.at_least:])
        return tuple(sorted(chain, key=lambda t: t.at))


@dataclass(frozen=True, slots=True)
class LabelRule:
    """``labels:`` entry: tools matching all given matchers carry ``labels``; ``touched_on`` says which of their
    calls count as touching them (``any`` forwarded call, a ``success``\\ ful one, or a ``result`` that flowed back
    to the client and is not ``isError``)."""

    labels: tuple[str, ...]
    origin: str
    tools: tuple[Glob, ...] | None = None
    upstreams: frozenset[str] | None = None
    annotations: tuple[tuple[str, Any], ...] = ()
    touched_on: TouchedOn = "success"


@dataclass(frozen=True, slots=True)
class FlowSettings:
    """The ``flow:`` block of a policy set.

    ``sanitize_label``: a result in which sanitization found injection markers adds this label to the context,
    whatever the tool's own labels. ``stateless_window_s``: in the stateless era the context is the principal,
    and touches older than this are forgotten. ``retention_s``: how long any context keeps a touch at most.
    """

    sanitize_label: str | None = "untrusted_content"
    stateless_window_s: float = 3600.0
    retention_s: float = 86400.0
    max_touches: int = 256


# How the policy guard reads the history a decision needs: ``(settings, call, now)`` to the history of the call's
# context, or None when it could not be read (the decision then fails closed). ``bastion.flow.history_reader``
# makes one over a flow store; the guard takes it as a callable so the pure policy never imports the store.
ReadHistory = Callable[[FlowSettings, CallContext, float], Awaitable[FlowHistory | None]]


def merge_labels(found: dict[str, TouchedOn], rule: LabelRule) -> None:
    """Add ``rule``'s labels to ``found``. If two entries give one label, the one counting more calls wins: a touch
    is evidence for a deny, so missing one is the unsafe error."""
    for label in rule.labels:
        if label not in found or _ORDER[rule.touched_on] > _ORDER[found[label]]:
            found[label] = rule.touched_on


_ORDER = {"result": 0, "success": 1, "any": 2}


def touches_for(labels: Mapping[str, TouchedOn], *, forwarded: bool, succeeded: bool, result_returned: bool,
                injection: bool, settings: FlowSettings, tool: str, at: float, call_id: str) -> tuple[Touch, ...]:
    """What one finished call adds to its context. ``forwarded``: the upstream was asked; ``succeeded``: it
    answered with a result bastion passed on; ``result_returned``: that result was not ``isError``."""
    passed = {"any": forwarded, "success": succeeded, "result": result_returned}
    out = [Touch(label, tool, at, call_id) for label, on in sorted(labels.items()) if passed[on]]
    if injection and settings.sanitize_label is not None and succeeded \
            and not any(t.label == settings.sanitize_label for t in out):
        out.append(Touch(settings.sanitize_label, tool, at, call_id))
    return tuple(out)


def flow_audit(chain: Iterable[Touch], history_read: bool) -> dict[str, Any]:
    """The ``flow`` object of a denial's audit record: the earlier calls that set each label, oldest first.
    ``history_read`` false: the store could not be read and the rule denied without evidence (fail closed)."""
    return {"history": "read" if history_read else "unavailable",
            "chain": [{"label": t.label, "tool": t.tool, "call_id": t.call_id,
                       "time": datetime.fromtimestamp(t.at, UTC).isoformat(timespec="milliseconds")
                       .replace("+00:00", "Z")} for t in chain]}
