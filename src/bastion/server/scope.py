"""``Scope``: what a request's era and session established before its method is dispatched.

The front door builds one per request (``server/lifecycle.py`` from a session, ``server/modern.py`` from the
request's own ``_meta``); every handler behind ``Dispatcher`` reads the caller from it and nothing from HTTP, so the
handlers serve both eras alike and only consult ``era`` where the revisions really differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from bastion.call import Era
from bastion.principal import Principal
from bastion.server.emitter import Emitter
from bastion.sessions.live import LiveSession
from bastion.sessions.store import SessionData

__all__ = ["Scope"]


class Scope(NamedTuple):
    """Immutable, one per request: a named tuple because a frozen dataclass sets each field through
    ``object.__setattr__``, more than twice the cost. Change a field with ``_replace``."""

    principal: Principal
    era: Era
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any] | None
    # The channel back to the client while this request runs (``NullEmitter`` on a plain JSON answer).
    emitter: Emitter
    session: SessionData | None = None
    live: LiveSession | None = None
    log_level: str | None = None
    # The W3C trace context of the HTTP request (headers); ``params._meta`` carries it per message and wins.
    traceparent: str | None = None
    tracestate: str | None = None
