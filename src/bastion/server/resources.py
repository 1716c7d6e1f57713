"""Resources across upstreams: public URIs, and subscriptions to them.

Every upstream names its resources in its own URI space; bastion serves them all on one endpoint, so a prefixed
upstream's URIs are public as ``<prefix>+<uri>`` (``bastion.catalogue``). Two directions:

- **in**: a URI a client sends (``resources/read``, ``resources/subscribe``, a listen request, a completion's
  ``ref/resource``) is brought to its canonical form (``bastion.uris``), routed to its upstream and original URI,
  and only if this caller may see that resource: a hidden resource and a missing one get the same answer. The
  canonical form is what the policy judges, what subscriptions are kept under and what the upstream is sent; a
  URI without one is refused as invalid (a syntactic answer, the same whoever asks);
- **out**: URIs inside what an upstream returns (read contents, links and embedded resources in tool results) get
  their public form, so a client that follows them is routed back to the same upstream.

Subscriptions are asked for once but delivered many times: whether an update reaches a subscriber is decided
again at each delivery (``bastion.delivery``), under the policy in force then.

An upstream subscription is shared by every session and listen stream of this replica that wants the resource:
bastion subscribes upstream for each subscriber, and unsubscribes only once nobody here wants it any more.

Kept apart from the method table (``server/dispatch.py``) because the listen stream of 2026-07-28
(``server/modern.py``) subscribes through it too, outside any method.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple

from bastion import catalogue as cat
from bastion.errors import InvalidParams, ProtocolError
from bastion.gateway import Gateway
from bastion.jsonrpc import RequestId
from bastion.protocol.messages import SubscribeParams
from bastion.protocol.methods import RESOURCES_SUBSCRIBE, RESOURCES_UNSUBSCRIBE
from bastion.ratelimit.forwarded import Target
from bastion.ratelimit.model import Allowance
from bastion.server.admission import Admission
from bastion.server.relay import relay
from bastion.server.request_audit import RequestAudit, RequestFacts
from bastion.server.scope import Scope
from bastion.uris import UriRefused, canonical_uri

__all__ = ["Resources", "Routed", "map_result_uris", "public_contents"]


class Routed(NamedTuple):
    """A resource URI a caller may see: its upstream, the URI the upstream knows (canonical), the canonical public
    URI, and the limits the policy attaches to requests for it."""

    upstream: str
    original: str
    public: str
    allowance: Allowance


class Resources:
    def __init__(self, gateway: Gateway, admission: Admission, trail: RequestAudit,
                 upstream_is_modern: Callable[[str], bool], listened: Callable[[], set[str]] = set) -> None:
        self.gw = gateway
        self._admission = admission
        self._trail = trail
        self._upstream_is_modern = upstream_is_modern
        # The public URIs this replica's open listen streams (2026-07-28) hold upstream subscriptions for.
        self._listened = listened

    def route_visible(self, scope: Scope, uri: object, facts: RequestFacts | None = None) -> Routed:
        """Where a URI this caller may see goes (``Routed``); else "not found", whichever it was. The original URI
        is canonical too: forward it, and the upstream acts on what was judged. ``facts``, when given, learns what
        was asked and, for the audit record only, whether a refused URI was unknown or hidden."""
        if not isinstance(uri, str):
            raise InvalidParams(f"Resource not found: {uri}", data={"uri": uri})
        try:
            public = canonical_uri(uri)
        except UriRefused as exc:
            if facts is not None:
                facts.asked(uri=uri)
                facts.stage = "parse"
            raise InvalidParams(f"Invalid resource URI: it has {exc.reason}", data={"uri": uri}) from None
        if facts is not None:
            facts.asked(uri=public)
        routed = cat.route_uri(self.gw.view.catalogue, public, self.gw.unprefixed)
        allowance = self.gw.access.resource_allowance(scope.principal, routed[0], public) \
            if routed is not None else None
        if routed is None or allowance is None:
            if facts is not None:
                facts.reason = "unknown resource" if routed is None else "resource not visible to the caller"
            raise InvalidParams(f"Resource not found: {uri}", data={"uri": uri})
        if facts is not None:
            facts.resolved(routed[0], routed[1], uri=public)
        return Routed(routed[0], routed[1], public, allowance)

    def held(self, scope: Scope, method: str, routed: Routed,
             facts: RequestFacts) -> AbstractAsyncContextManager[None]:
        """The limiter's admission of one request for ``routed`` (``server/admission.py``)."""
        return self._admission.held(scope, method, Target.resources(routed.upstream), routed.allowance, facts)

    async def subscribe(self, scope: Scope, params: SubscribeParams, facts: RequestFacts) -> dict[str, Any]:
        routed = self.route_visible(scope, params.get("uri"), facts)
        async with self.held(scope, RESOURCES_SUBSCRIBE, routed, facts):
            await self.gw.forward(routed.upstream, RESOURCES_SUBSCRIBE, {"uri": routed.original},
                                  on_message=relay(self.gw, scope, routed.upstream, None))
        live = scope.live
        if live is not None and routed.public not in live.subscriptions:
            live.subscriptions.add(routed.public)

            async def undo() -> None:
                # Unrecorded, answered -31005: the session does not hold it, and the upstream is released unless
                # someone else here wants it.
                live.subscriptions.discard(routed.public)
                await self.release((routed.public,), set())

            facts.undo = undo
        return {}

    async def unsubscribe(self, scope: Scope, params: SubscribeParams, facts: RequestFacts) -> dict[str, Any]:
        routed = self.route_visible(scope, params.get("uri"), facts)
        # Counted whether or not it then reaches the upstream (as a tool call counts whatever happens to it), and
        # before anything changes: a refused unsubscribe leaves the subscription as it was, for the retry.
        async with self.held(scope, RESOURCES_UNSUBSCRIBE, routed, facts):
            if scope.live is not None:
                scope.live.subscriptions.discard(routed.public)
            # Other sessions of this replica, or its listen streams, may still want updates for the same resource.
            if not self._wanted_here(routed.public):
                await self.gw.forward(routed.upstream, RESOURCES_UNSUBSCRIBE, {"uri": routed.original},
                                      on_message=relay(self.gw, scope, routed.upstream, None))
        return {}

    async def listen(self, scope: Scope, uris: Iterable[str], rid: RequestId | None = None) -> frozenset[str]:
        """Subscribe upstream to the resources a listen request names; the ones that worked are honoured, under
        their canonical public URIs.

        Only handshake-era upstreams can be subscribed to (``resources/subscribe``): bastion's own listen
        stream to a modern upstream carries list changes only, so their resources are not honoured. Each
        subscription it sends passes the limits as a ``resources/subscribe`` would; one refused is not honoured.

        Every upstream subscription this sends is either honoured (the listen stream owns it and releases it when
        it closes) or released here: one whose record could not be written (``audit.required``), and all of them
        when the request ends before it returns (cancelled, or failed mid-way). Nobody would release them later:
        the upstream would go on subscribed for a stream that never opened.
        """
        honoured: set[str] = set()
        sent: set[str] = set()
        try:
            for uri in sorted(uris):
                try:
                    public = await self._trail.run(scope, RESOURCES_SUBSCRIBE, rid, None,
                                                   functools.partial(self._listen_one, scope, uri, sent))
                except ProtocolError:
                    continue
                if public is not None:
                    honoured.add(public)
        except BaseException:
            await self._release_owned(sent, set())
            raise
        await self._release_owned(sent - honoured, honoured)
        return frozenset(honoured)

    async def _listen_one(self, scope: Scope, uri: str, sent: set[str], facts: RequestFacts) -> str | None:
        """Subscribe upstream to one resource of a listen request (its public URI, honoured): its own ``request``
        record, with the listen request's id; ``sent`` learns it once the upstream accepted it. ``None``, and no
        record, for a resource on an upstream that cannot be subscribed to (nothing was forwarded)."""
        routed = self.route_visible(scope, uri, facts)
        if self._upstream_is_modern(routed.upstream):
            facts.recorded = False
            return None
        async with self.held(scope, RESOURCES_SUBSCRIBE, routed, facts):
            await self.gw.forward(routed.upstream, RESOURCES_SUBSCRIBE, {"uri": routed.original},
                                  on_message=relay(self.gw, scope, routed.upstream, None))
            sent.add(routed.public)
        return routed.public

    async def _release_owned(self, uris: set[str], still_wanted: set[str]) -> None:
        """``release`` for subscriptions a listen request sent but will not own; it cannot fail the request."""
        if uris:
            with contextlib.suppress(Exception):
                await self.release(uris, still_wanted)

    async def release(self, uris: Iterable[str], still_wanted: set[str]) -> None:
        """Unsubscribe upstream from resources nobody on this replica listens to any more (best effort)."""
        for uri in uris:
            if uri in still_wanted or self._wanted_here(uri):
                continue
            routed = cat.route_uri(self.gw.view.catalogue, uri, self.gw.unprefixed)
            if routed is None:
                continue
            with contextlib.suppress(ProtocolError):
                # Nobody's request: the listen streams that wanted it are gone.
                await self.gw.forward(routed[0], RESOURCES_UNSUBSCRIBE, {"uri": routed[1]}, on_message=None)

    def _wanted_here(self, uri: str) -> bool:
        """Does a session or a listen stream of this replica still hold a subscription to this public URI?"""
        return any(uri in live.subscriptions for live in self.gw.live.all()) or uri in self._listened()


def public_contents(result: dict[str, Any], prefix: str | None) -> None:
    """Give the URIs of a ``resources/read`` result's contents their public form (in place)."""
    contents = result.get("contents")
    if prefix and isinstance(contents, list):
        result["contents"] = [
            {**c, "uri": cat.public_uri(prefix, c["uri"])} if isinstance(c, dict) and isinstance(
                c.get("uri"), str) else c for c in contents]


def _routable(uri: Any) -> bool:
    # Web URLs are links for people, not resources of this upstream: they stay as they are.
    return isinstance(uri, str) and not uri.lower().startswith(("http://", "https://"))


def map_result_uris(result: dict[str, Any], prefix: str | None) -> dict[str, Any]:
    """Give resource URIs inside a prefixed upstream's tool result their public form, so reads route back."""
    content = result.get("content")
    if not prefix or not isinstance(content, list):
        return result
    mapped = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "resource_link" and _routable(block.get("uri")):
            block = {**block, "uri": cat.public_uri(prefix, block["uri"])}
        elif isinstance(block, dict) and block.get("type") == "resource" and isinstance(block.get("resource"), dict) \
                and _routable(block["resource"].get("uri")):
            block = {**block, "resource": {**block["resource"],
                                           "uri": cat.public_uri(prefix, block["resource"]["uri"])}}
        mapped.append(block)
    return {**result, "content": mapped}
