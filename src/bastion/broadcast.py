"""Upstream notifications sent outside any request, delivered to this replica's sessions.

(Messages an upstream sends *within* a call go back to that call's caller: ``server.relay``.)

The pool hands every such notification here (``on_event``). Two are relayed, both cleaned as upstream text
first (``sanitize.upstream_text``): ``notifications/resources/updated``, under its canonical public URI
(``bastion.uris``), to the sessions subscribed to that resource and to the change feed (modern listen streams);
and ``notifications/message``, to the sessions that asked for logging (``server.log_relay`` decides who).
Every other notification is dropped. Each delivery is authorised for the receiving session's principal under the
policy in force at that moment (``bastion.delivery``): a subscription made before a reload carries no right.
Each session's stream is a bounded queue (``bastion.backlog``): a client that stops reading gets repeated updates
of one URI coalesced and the rest dropped, counted, never an unbounded backlog.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bastion import catalogue as cat
from bastion.access import AccessControl
from bastion.changes import ChangeFeed
from bastion.delivery import DeliveryGate, ResourceTopic, UpstreamTopic
from bastion.server.log_relay import log_targets, stamped
from bastion.sessions.live import LiveSessions
from bastion.uris import try_canonical
from bastion.view import View

# Cleans one notification's params: (upstream, method, params) -> params.
CleanNotification = Callable[[str, str, dict[str, Any]], dict[str, Any]]


class UpstreamBroadcast:
    def __init__(self, prefixes: Mapping[str, str | None], live: LiveSessions, view: Callable[[], View],
                 access: AccessControl, clean: CleanNotification, changes: ChangeFeed[View]) -> None:
        self._prefixes = dict(prefixes)
        self._live = live
        self._gate = DeliveryGate(view, access, [name for name, prefix in self._prefixes.items() if not prefix])
        self._clean = clean
        self._changes = changes

    async def __call__(self, upstream: str, method: str, params: Mapping[str, Any]) -> None:
        """Relay an upstream's resource update to the sessions of this replica subscribed to that resource, and
        its log messages outside any call to the sessions that asked for logging (``server.log_relay``)."""
        if method == "notifications/message":
            self._relay_log(upstream, params)
            return
        if method != "notifications/resources/updated" or not isinstance(params.get("uri"), str):
            return
        public = try_canonical(cat.public_uri(self._prefixes[upstream], params["uri"]))
        if public is None:
            return  # no canonical form: nobody can have subscribed to it
        cleaned = self._clean(upstream, method, {**params, "uri": public})
        message = {"jsonrpc": "2.0", "method": method, "params": cleaned}
        topic = ResourceTopic(public)
        for live in self._live.all():
            if public in live.subscriptions and live.get_stream is not None \
                    and self._gate.allows(live.principal, topic):
                live.get_stream.offer(message)
        self._changes.resource_updated(public, cleaned)

    def _relay_log(self, upstream: str, params: Mapping[str, Any]) -> None:
        topic = UpstreamTopic(upstream)
        targets = log_targets(self._live.all(), params.get("level"), lambda p: self._gate.allows(p, topic))
        if not targets:
            return
        cleaned = self._clean(upstream, "notifications/message", stamped(upstream, params))
        message = {"jsonrpc": "2.0", "method": "notifications/message", "params": cleaned}
        for live in targets:
            if live.get_stream is not None:
                live.get_stream.offer(message)
