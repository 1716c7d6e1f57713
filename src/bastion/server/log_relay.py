"""Upstream log messages that belong to no request, relayed to the sessions that asked for logging.

A handshake-era client asks for log messages with ``logging/setLevel``; bastion then relays an upstream's
``notifications/message`` sent outside any call on that session's GET stream, when the message's level is at or
above the session's floor. Two more conditions keep this from becoming a channel between tenants:

- only sessions whose principal may see something of that upstream (a tool, prompt or resource, by the same
  access policy that governs lists and calls) receive its messages;
- the GET stream's backlog is bounded (``bastion.backlog``, ``STREAM_BACKLOG``): log messages are best effort,
  and a client that stops reading must not make bastion buffer an upstream's chatter without limit. Past the bound
  they are dropped, counted, and the client is told how many with one marker.

Pure decisions here; ``bastion.broadcast.UpstreamBroadcast`` does the cleaning and the delivery.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bastion.backlog import STREAM_BACKLOG
from bastion.principal import Principal
from bastion.protocol.methods import LOG_LEVELS
from bastion.sessions.live import LiveSession

__all__ = ["MAX_BACKLOG", "level_allows", "log_targets", "stamped"]

# Messages waiting on one GET stream beyond which further log messages are dropped for it (the queue drops them).
MAX_BACKLOG = STREAM_BACKLOG


def level_allows(floor: str | None, level: Any) -> bool:
    """Whether a message of ``level`` passes a session's explicit ``floor``; no floor means "did not ask"."""
    if floor is None or level not in LOG_LEVELS or floor not in LOG_LEVELS:
        return False
    return LOG_LEVELS.index(level) >= LOG_LEVELS.index(floor)


def log_targets(sessions: Iterable[LiveSession], level: Any,
                may_see: Callable[[Principal], bool]) -> list[LiveSession]:
    """The live sessions that get this message: a GET stream open, logging asked for at or below ``level``, and
    a principal allowed to see the upstream. A full stream is still a target: its queue drops the message and
    counts it (``bastion.backlog``)."""
    out = []
    for live in sessions:
        stream = live.get_stream
        if stream is None or live.principal is None or not level_allows(live.log_level, level):
            continue
        if not may_see(live.principal):
            continue
        out.append(live)
    return out


def stamped(upstream: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The message as relayed: outside a call the client cannot tell where it came from, so a message without a
    ``logger`` names its upstream."""
    out = dict(params)
    if not isinstance(out.get("logger"), str):
        out["logger"] = upstream
    return out
