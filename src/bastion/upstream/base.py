"""The back door's contract: one live connection to one upstream MCP server, whatever its transport.

The gateway core only ever talks to upstreams through ``Upstream``; the transports (stdio, Streamable HTTP,
HTTP+SSE) implement it. Everything transport-specific (framing, sessions, re-initialization, restarts,
era detection) stays behind this line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

UpstreamEra = Literal["legacy", "modern"]
# What an admin configures per upstream: detect the era, or pin it.
EraSetting = Literal["auto", "legacy", "modern"]

# A message the upstream sent that relates to one in-flight request: a notification (progress, log message) or
# a server-to-client request (sampling/createMessage, elicitation/create, roots/list). For requests the handler
# returns the JSON-RPC ``result`` object (or raises ``bastion.errors.ProtocolError`` to send an error back);
# for notifications its return value is ignored.
RelatedMessageHandler = Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any] | None]]

# Notifications the upstream sent outside any request (``notifications/tools/list_changed`` and friends).
NotificationHandler = Callable[[str, Mapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class UpstreamInfo:
    """What the upstream said about itself at connection time (``InitializeResult`` or ``DiscoverResult``)."""

    era: UpstreamEra
    protocol_version: str
    capabilities: Mapping[str, Any] = field(default_factory=dict)
    server_info: Mapping[str, Any] = field(default_factory=dict)
    instructions: str | None = None


class Upstream(Protocol):
    """One upstream MCP server.

    ``request`` sends one JSON-RPC request and returns its ``result`` object. It raises
    ``bastion.errors.UpstreamRpcError`` for a JSON-RPC error answer, ``UpstreamUnavailable`` when the server cannot
    be reached (or died), and ``UpstreamTimeout`` after ``timeout`` seconds, in which case the upstream is told to
    cancel (``notifications/cancelled``, or closing the stream for modern HTTP). Cancelling the awaiting task
    cancels the upstream request the same way. Request ids and progress tokens are the transport's own, so
    callers may pass any ``params``: a client's ``progressToken`` is rewritten on the way out and restored on the
    way back.

    Every transport is restartable: ``start`` after ``close`` (whether the earlier ``start`` failed or succeeded)
    connects from scratch, exactly as on a new object. The pool relies on it: it keeps one object per upstream for
    the gateway's lifetime (the view publisher, the health wiring and the admin pages hold it), closes a half-started
    one after a failed connect and starts the same object again at its next retry. ``tests/upstream/test_restart.py``
    checks this for every transport class.
    """

    name: str

    @property
    def info(self) -> UpstreamInfo | None:
        """``None`` until connected."""

    async def start(self, on_notification: NotificationHandler) -> UpstreamInfo:
        """Connect (spawn, initialize or discover), also again after ``close``. Raises ``UpstreamUnavailable`` on
        failure, after which the caller calls ``close`` to release what the attempt left behind."""

    async def request(self, method: str, params: Mapping[str, Any] | None, *, timeout: float,
                      on_message: RelatedMessageHandler | None = None) -> dict[str, Any]: ...

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None: ...

    def restart(self, reason: str) -> bool:
        """Replace a connection that is held open but no longer answers: the pool calls it when the upstream's
        health becomes ``down`` while the transport holds it connected, since nothing else would end such a
        connection (a hung stdio child keeps its pipes, a frozen HTTP+SSE stream or Streamable HTTP session keeps
        its TCP connections). The transport drops what it holds. A supervised transport (stdio, HTTP+SSE) fails
        the requests in flight and reconnects as after a lost connection: ``restarting`` to its ``watch``
        listener, ``connected`` once the new connection answered its handshake, the supervisor's backoff between
        attempts. Streamable HTTP leaves its requests in flight to end on their own (each is an exchange of its
        own), initializes one new session and reports ``connected`` if it answers; else the upstream stays
        ``down`` and its next request (a probe's) initializes first. True when a restart began;
        False when there is nothing to replace (not connected, already restarting, or nothing per-connection to
        drop, as in the stateless 2026-07-28 revision, where every request is a new exchange)."""

    async def close(self) -> None:
        """Shut down cleanly (stdio: close stdin, then SIGTERM, then SIGKILL; HTTP: DELETE the session). Not final:
        a later ``start`` connects again."""
