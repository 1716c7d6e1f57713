"""``subscriptions/listen`` (2026-07-28): what a listening client opted into, and the streams of this replica.

A modern client has no session and no GET stream; it asks for change notifications with one long-lived
``subscriptions/listen`` request whose SSE response is the stream. The first message is the acknowledgement
with the honoured subset of what it asked for; every message carries the listen request's id under
``_meta["io.modelcontextprotocol/subscriptionId"]``; nothing it did not opt into is ever sent.

``ListenFilter`` is the pure part (parsing, the acknowledgement, "does this stream want this change?");
``Listeners`` keeps the open streams of this replica. Streams are per replica like legacy GET streams: every
replica learns of upstream changes on its own, so each one informs its own listeners.

What a stream opted into is not what it may receive: each message is authorised when it is delivered, for the
stream's principal under the policy in force then (``bastion.delivery``), so a reload that hides a resource or a
list's entries stops what the stream hears of them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bastion import jsonrpc
from bastion.delivery import DeliveryGate, ListChange, ResourceTopic
from bastion.errors import InvalidParams
from bastion.principal import Principal
from bastion.protocol.messages import ListenParams
from bastion.protocol.meta import SUBSCRIPTION_ID_KEY as SUBSCRIPTION_ID
from bastion.protocol.methods import ACKNOWLEDGED, RESOURCE_UPDATED, list_changed

__all__ = ["ACKNOWLEDGED", "SUBSCRIPTION_ID", "ListenFilter", "Listeners", "Stream"]

# Catalogue list kind (as the gateway announces changes) → the filter flag that opts into it.
LIST_FLAGS = {"tools": "toolsListChanged", "prompts": "promptsListChanged", "resources": "resourcesListChanged"}
MAX_RESOURCE_SUBSCRIPTIONS = 256
# A client that stops reading must not make bastion buffer without bound: its stream is ended instead, and it
# re-listens and refetches (there is no replay in this revision anyway).
MAX_BUFFERED = 1024


@dataclass(frozen=True, slots=True)
class ListenFilter:
    lists: frozenset[str] = frozenset()  # "tools", "prompts", "resources"
    resources: frozenset[str] = frozenset()  # public resource URIs

    @classmethod
    def from_params(cls, params: ListenParams) -> ListenFilter:
        wanted = params.get("notifications")
        if not isinstance(wanted, Mapping):
            raise InvalidParams("subscriptions/listen requires a 'notifications' object")
        lists = frozenset(kind for kind, flag in LIST_FLAGS.items() if wanted.get(flag) is True)
        uris = wanted.get("resourceSubscriptions")
        if uris is None:
            uris = []
        if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
            raise InvalidParams("notifications.resourceSubscriptions must be an array of URIs")
        if len(uris) > MAX_RESOURCE_SUBSCRIPTIONS:
            raise InvalidParams(f"at most {MAX_RESOURCE_SUBSCRIPTIONS} resourceSubscriptions per listen request")
        return cls(lists=lists, resources=frozenset(uris))

    def honoured(self) -> dict[str, Any]:
        """The acknowledgement's ``notifications``: only what will be delivered, no false flags."""
        out: dict[str, Any] = {LIST_FLAGS[kind]: True for kind in sorted(self.lists)}
        if self.resources:
            out["resourceSubscriptions"] = sorted(self.resources)
        return out

    def wants_list(self, kind: str) -> bool:
        return kind in self.lists

    def wants_resource(self, uri: str) -> bool:
        return uri in self.resources


def tagged(method: str, params: Mapping[str, Any], subscription_id: jsonrpc.RequestId) -> dict[str, Any]:
    """A notification for one stream, stamped with its subscription id."""
    meta = {**jsonrpc.obj(params.get("_meta")), SUBSCRIPTION_ID: subscription_id}
    return jsonrpc.notification(method, {**params, "_meta": meta})


@dataclass(slots=True, eq=False)
class Stream:
    """One open listen stream. ``queue`` holds ready-to-send messages; ``None`` ends the stream."""

    subscription_id: jsonrpc.RequestId
    principal: Principal  # who listens: every message is authorised for it at delivery
    filter: ListenFilter
    queue: asyncio.Queue[dict[str, Any] | None] = field(
        default_factory=lambda: asyncio.Queue(MAX_BUFFERED + 1))

    def end(self) -> None:
        """End the stream now: what is buffered is dropped, nothing more is sent."""
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)

    def offer(self, message: dict[str, Any] | None) -> None:
        try:
            self.queue.put_nowait(message)
        except asyncio.QueueFull:
            # A stalled reader: drop what is buffered and end the stream; the client re-listens and refetches.
            self.end()


class Listeners:
    """The listen streams open on this replica; ``gate`` authorises each message for each stream.

    A principal holds at most ``max_per_principal`` of them here (``sessions.max_per_principal``, the bound on a
    legacy principal's sessions, each of which has at most one GET stream): past it, opening one ends that
    principal's oldest, as ``initialize`` ends its least recently used session. A client that leaks listen
    streams ends only its own, and nobody can make bastion hold an unbounded number of them (each holds a
    connection, a queue of up to ``MAX_BUFFERED`` messages and up to ``MAX_RESOURCE_SUBSCRIPTIONS`` upstream
    subscriptions)."""

    def __init__(self, gate: DeliveryGate, max_per_principal: int | None = None) -> None:
        self._gate = gate
        self._max_per_principal = max_per_principal
        # Insertion order is opening order: the first of a principal's streams is its oldest.
        self._streams: dict[Stream, None] = {}

    def open(self, stream: Stream) -> list[Stream]:
        """Add ``stream``; returns the streams of its principal it ended to stay within the bound."""
        ended: list[Stream] = []
        if self._max_per_principal is not None:
            mine = [s for s in self._streams if s.principal.id == stream.principal.id]
            for oldest in mine[:max(0, len(mine) + 1 - self._max_per_principal)]:
                self.close(oldest)
                oldest.end()
                ended.append(oldest)
        self._streams[stream] = None
        return ended

    def close(self, stream: Stream) -> None:
        self._streams.pop(stream, None)

    def all(self) -> list[Stream]:
        return list(self._streams)

    def wanted_resources(self) -> set[str]:
        return {uri for s in self._streams for uri in s.filter.resources}

    def lists_changed(self, changes: list[ListChange]) -> None:
        for stream in self.all():
            for change in changes:
                if stream.filter.wants_list(change.kind) and self._gate.allows(stream.principal, change):
                    stream.offer(tagged(list_changed(change.kind), {}, stream.subscription_id))

    def resource_updated(self, uri: str, params: Mapping[str, Any]) -> None:
        """An update of the resource with canonical public URI ``uri``."""
        topic = ResourceTopic(uri)
        for stream in self.all():
            if stream.filter.wants_resource(uri) and self._gate.allows(stream.principal, topic):
                stream.offer(tagged(RESOURCE_UPDATED, params, stream.subscription_id))

    def end_all(self) -> None:
        for stream in self.all():
            with contextlib.suppress(asyncio.QueueFull):
                stream.queue.put_nowait(None)
