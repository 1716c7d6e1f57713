"""What an upstream sends back in the middle of a call, and how it reaches the caller (or does not).

While an upstream works on a request it may report progress, log, or ask the client something (sampling,
elicitation, roots). bastion is the client's stand-in: it passes each message on only when the caller can receive
it on this request (a handshake-era client on an SSE response stream), only when the caller wanted it (a progress
token, a log floor), and cleaned like any other upstream text. Whatever cannot be relayed is refused towards the
upstream, so it can degrade instead of waiting.

Kept apart from ``Dispatcher`` because it is the one path where messages flow upstream-to-client within a call;
the dispatcher decides *that* a call relays, this module decides *what*.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from bastion.call import AskClient, Era
from bastion.errors import ProtocolError
from bastion.gateway import Gateway
from bastion.protocol.methods import INPUT_CAPABILITY, LOG_MESSAGE, PROGRESS, ROOTS_LIST
from bastion.server.emitter import NullEmitter
from bastion.server.log_relay import level_allows
from bastion.server.scope import Scope

__all__ = ["RelayHandler", "asker", "relay", "wants_log"]

# (method, params) of one upstream message -> the client's answer to a request, or None.
RelayHandler = Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any] | None]]


def asker(scope: Scope) -> AskClient | None:
    """How a guard asks this caller something mid-call: a session-based client that declared elicitation,
    on a request whose response stream can carry the question; otherwise None."""
    if scope.era != "legacy" or "elicitation" not in scope.client_capabilities or \
            isinstance(scope.emitter, NullEmitter):
        return None
    emitter = scope.emitter

    async def ask(method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        return await emitter.ask(method, params, timeout=timeout)

    return ask


def relay(gateway: Gateway, scope: Scope, upstream: str, progress_token: Any) -> RelayHandler:
    """The message handler for one call of ``scope``'s caller to ``upstream``."""
    audience = scope.session.id if scope.session is not None else None
    return _OwnedRelay(scope.principal.id, audience, not isinstance(scope.emitter, NullEmitter),
                       _relay_to(gateway, scope, upstream, progress_token))


def _relay_to(gw: Gateway, scope: Scope, upstream: str, progress_token: Any) -> RelayHandler:
    async def on_message(method: str, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        if method == PROGRESS:
            if progress_token is not None:
                await scope.emitter.notify(method, gw.clean_notification(upstream, method, dict(params)))
            return None
        if method == LOG_MESSAGE:
            if wants_log(scope.log_level, params.get("level"), scope.era):
                # The message object as received: several calls' relays may get the same one, cleaned once.
                message = params if isinstance(params, dict) else dict(params)
                await scope.emitter.notify(method, gw.clean_notification(upstream, method, message))
            return None
        capability = INPUT_CAPABILITY.get(method)
        if method == ROOTS_LIST and (scope.era != "legacy" or capability not in scope.client_capabilities
                                     or isinstance(scope.emitter, NullEmitter)):
            # bastion advertises roots to upstreams; a caller that cannot be asked shares none.
            return {"roots": []}
        if capability is not None:
            if scope.era != "legacy":
                # A 2026-07-28 client can only be asked through an input_required result, which would need
                # this upstream call held open across HTTP requests: refused, so the upstream can degrade.
                raise ProtocolError(-32601, f"{method} cannot be relayed to a 2026-07-28 client mid-call")
            if capability not in scope.client_capabilities:
                raise ProtocolError(-32601, f"the client did not declare the {capability} capability")
            return await scope.emitter.ask(method, gw.clean_notification(upstream, method, dict(params)),
                                           timeout=gw.client_request_timeout)
        if method.startswith("notifications/"):
            return None
        raise ProtocolError(-32601, f"Method not found: {method}")

    return on_message


def wants_log(floor: str | None, level: Any, era: Era) -> bool:
    """Whether a caller gets an upstream's log message on its call: by its floor when it set one; without one,
    a session-era client gets everything and a 2026-07-28 client nothing (it asks per request)."""
    if floor is None:
        return era == "legacy"
    return level_allows(floor, level)


class _OwnedRelay:
    """A request's message relay that says whose request it is: on a transport without per-request streams
    (stdio), the upstream session routes an unattributed server request by its principal
    (``upstream.session.owner_of``) and an unattributed log message by its client session (``audience_of``; None:
    a sessionless request, its own). ``reaches_client``: whether this request has a stream back to its client at
    all (``upstream.session.reaches_client``); a request without one still says whose it is."""

    __slots__ = ("_relay", "audience", "owner", "reaches_client")

    def __init__(self, owner: str, audience: str | None, reaches_client: bool, relay: RelayHandler):
        self.owner = owner
        self.audience = audience
        self.reaches_client = reaches_client
        self._relay = relay

    async def __call__(self, method: str, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return await self._relay(method, params)
