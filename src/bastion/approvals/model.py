"""What a pending approval is and how it ended. Plain data, JSON both ways (Redis carries it between replicas)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

VerdictOutcome = Literal["approved", "declined", "timed_out", "withdrawn"]
# How the verdict was given: the client's elicitation answer, the admin API (and the CLI or console calling it),
# a remembered yes (``remember: session|call``), or bastion itself (timeout, withdrawal).
Channel = Literal["elicitation", "admin_api", "cli", "console", "remembered", "gateway"]
CHANNELS: tuple[str, ...] = ("elicitation", "admin_api", "cli", "console", "remembered", "gateway")


def new_approval_id() -> str:
    """96 random bits in hex: safe in URLs and on a command line (an id starting with '-' would read as an
    option to ``bastion approvals show``)."""
    return secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """One held call, as approvers see it. ``arguments`` is a sanitized summary (see ``summarize``), never the
    raw values."""

    id: str
    principal: str
    tool: str
    upstream: str
    rule_id: str
    message: str | None
    arguments: Mapping[str, str]
    via: tuple[str, ...]
    created_at: float
    expires_at: float
    session: str | None
    replica: str

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["arguments"] = dict(self.arguments)
        data["via"] = list(self.via)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PendingApproval:
        return cls(id=str(data["id"]), principal=str(data["principal"]), tool=str(data["tool"]),
                   upstream=str(data["upstream"]), rule_id=str(data["rule_id"]), message=data.get("message"),
                   arguments={str(k): str(v) for k, v in dict(data.get("arguments") or {}).items()},
                   via=tuple(str(v) for v in data.get("via") or ()), created_at=float(data["created_at"]),
                   expires_at=float(data["expires_at"]), session=data.get("session"), replica=str(data["replica"]))


@dataclass(frozen=True, slots=True)
class Verdict:
    """How one approval ended: ``by`` is the deciding principal's id (None when bastion ended it)."""

    outcome: VerdictOutcome
    channel: Channel
    by: str | None = None
    at: float = 0.0

    @property
    def approved(self) -> bool:
        return self.outcome == "approved"

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "channel": self.channel, "by": self.by, "at": self.at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        outcome = data.get("outcome")
        channel = data.get("channel")
        if outcome not in ("approved", "declined", "timed_out", "withdrawn") or channel not in CHANNELS:
            raise ValueError("not a verdict")
        by = data.get("by")
        return cls(outcome=outcome, channel=channel, by=str(by) if by is not None else None,
                   at=float(data.get("at") or 0.0))


# Per-argument summary bound: approvers need to recognise the call, not read a payload.
_MAX_VALUE = 120
_MAX_ARGS = 20


def summarize(arguments: Mapping[str, Any], clean: Any = None) -> dict[str, str]:
    """A short, printable summary of call arguments for a person: at most 20 keys, values cut to 120
    characters, control characters removed. ``clean`` (text -> text) is the sanitizer's scrubber, if any."""

    out: dict[str, str] = {}
    for i, (key, value) in enumerate(arguments.items()):
        if i >= _MAX_ARGS:
            out["…"] = f"{len(arguments) - _MAX_ARGS} more argument(s)"
            break
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        text = "".join(ch if ch.isprintable() else " " for ch in text)
        if clean is not None:
            text = clean(text)
        out[_printable(str(key))[:_MAX_VALUE]] = text if len(text) <= _MAX_VALUE else text[:_MAX_VALUE - 1] + "…"
    return out


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in text)
