"""Method and notification names, and the facts about them that both sides of bastion rely on."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "ACKNOWLEDGED",
    "CANCELLED",
    "COMPLETE",
    "DISCOVER",
    "ELICITATION",
    "FORWARDED",
    "HANDSHAKE_ONLY",
    "INITIALIZE",
    "INITIALIZED",
    "INPUT_CAPABILITY",
    "LISTEN",
    "LIST_CHANGES",
    "LOCAL",
    "LOG_LEVELS",
    "LOG_MESSAGE",
    "PING",
    "PROGRESS",
    "PROMPTS_GET",
    "PROMPTS_LIST",
    "RESOURCES_LIST",
    "RESOURCES_READ",
    "RESOURCES_SUBSCRIBE",
    "RESOURCES_UNSUBSCRIBE",
    "RESOURCE_TEMPLATES_LIST",
    "RESOURCE_UPDATED",
    "ROOTS_LIST",
    "SAMPLING",
    "SET_LEVEL",
    "TOOLS_CALL",
    "TOOLS_LIST",
    "TOOLS_LIST_CHANGED",
    "list_changed",
]

# Client to server.
INITIALIZE = "initialize"
PING = "ping"
DISCOVER = "server/discover"
LISTEN = "subscriptions/listen"
TOOLS_LIST = "tools/list"
TOOLS_CALL = "tools/call"
PROMPTS_LIST = "prompts/list"
PROMPTS_GET = "prompts/get"
RESOURCES_LIST = "resources/list"
RESOURCE_TEMPLATES_LIST = "resources/templates/list"
RESOURCES_READ = "resources/read"
RESOURCES_SUBSCRIBE = "resources/subscribe"
RESOURCES_UNSUBSCRIBE = "resources/unsubscribe"
COMPLETE = "completion/complete"
SET_LEVEL = "logging/setLevel"

# Requests bastion sends on to an upstream on the caller's behalf: each makes an upstream work, so each passes the
# rate limits and concurrency caps (``bastion.ratelimit``), and a limit item's ``methods`` names some of them.
# ``subscriptions/listen`` (2026-07-28) is not one itself: it subscribes upstream through ``resources/subscribe``.
FORWARDED = (TOOLS_CALL, PROMPTS_GET, RESOURCES_READ, RESOURCES_SUBSCRIBE, RESOURCES_UNSUBSCRIBE, COMPLETE)
# Requests bastion answers itself (from its catalogue cache, its session store or nothing at all): no upstream
# works for them, so no limit counts them. Every method the front door serves is in exactly one of the two.
LOCAL = frozenset({INITIALIZE, PING, DISCOVER, LISTEN, TOOLS_LIST, PROMPTS_LIST, RESOURCES_LIST,
                   RESOURCE_TEMPLATES_LIST, SET_LEVEL})

# Server to client, mid-request: what a server may ask its client for.
SAMPLING = "sampling/createMessage"
ELICITATION = "elicitation/create"
ROOTS_LIST = "roots/list"
# Each of those, and the client capability it needs (as a request in the handshake era, or as an input request
# of an ``input_required`` result in 2026-07-28).
INPUT_CAPABILITY: Mapping[str, str] = {ELICITATION: "elicitation", SAMPLING: "sampling", ROOTS_LIST: "roots"}

# Notifications.
INITIALIZED = "notifications/initialized"
CANCELLED = "notifications/cancelled"
PROGRESS = "notifications/progress"
LOG_MESSAGE = "notifications/message"
RESOURCE_UPDATED = "notifications/resources/updated"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"


def list_changed(kind: str) -> str:
    """The change notification of one list: ``tools``, ``prompts`` or ``resources``."""
    return f"notifications/{kind}/list_changed"


TOOLS_LIST_CHANGED = list_changed("tools")
LIST_CHANGES = (TOOLS_LIST_CHANGED, list_changed("prompts"), list_changed("resources"))

# Requests of the handshake era that 2026-07-28 removed: no ping (no session to keep alive), log levels per request
# in ``_meta``, resource subscriptions through ``subscriptions/listen``.
HANDSHAKE_ONLY = frozenset({PING, SET_LEVEL, RESOURCES_SUBSCRIBE, RESOURCES_UNSUBSCRIBE})

# RFC 5424 severities, least severe first: a level passes a floor when it comes at or after it.
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
