"""The gateway's live state: the current catalogue view, the pool, the pipeline, sessions.

Everything here is either immutable and swapped whole (``View``, the access policy) or owned by the application
lifespan (pool, stores). Request handlers read ``gateway.view`` once per request, so a refresh in the middle of a
request never mixes two catalogue versions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from bastion import catalogue as cat
from bastion.call import CallContext, CallRecord, Era, Outcome
from bastion.errors import UnknownTool, UpstreamRpcError, UpstreamTimeout, UpstreamUnavailable
from bastion.pipeline import Pipeline
from bastion.pool import UpstreamPool
from bastion.principal import Principal
from bastion.server.log_relay import log_targets, stamped
from bastion.server.sessions import LiveSessions, SessionStore
from bastion.settings import Settings
from bastion.strictjson import printable
from bastion.tool import ToolEntry
from bastion.tracing import NO_TRACING, Tracing
from bastion.upstream.base import RelatedMessageHandler
from bastion.visibility import ToolListings

log = structlog.get_logger("bastion.gateway")


class AccessControl(Protocol):
    """What a principal may see. The same decision function that governs calls, so list and call agree."""

    def tool_visible(self, principal: Principal, entry: ToolEntry) -> bool: ...

    def prompt_visible(self, principal: Principal, upstream: str, public_name: str) -> bool: ...

    def resource_visible(self, principal: Principal, upstream: str, uri: str) -> bool: ...

    @property
    def per_principal(self) -> bool:
        """True when what a caller sees depends on who it is (modern ``cacheScope: private``)."""


class AllowAll:
    """No access policy configured: every authenticated principal sees and may call everything."""

    per_principal = False

    def tool_visible(self, principal: Principal, entry: ToolEntry) -> bool:
        return True

    def prompt_visible(self, principal: Principal, upstream: str, public_name: str) -> bool:
        return True

    def resource_visible(self, principal: Principal, upstream: str, uri: str) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class View:
    """One catalogue version with everything derived from it, swapped whole."""

    catalogue: cat.Catalogue = field(default_factory=cat.Catalogue)
    # Tools hidden from lists and refused on call whatever the policy says (hostile schema, changed pin…),
    # with the reason for the log and the audit record.
    quarantined: Mapping[str, str] = field(default_factory=dict)
    # Per-tool objects derived once per version (compiled validators), keyed by public name.
    derived: Mapping[str, Any] = field(default_factory=dict)
    instructions: str | None = None
    # Each upstream's own instructions, as sent: what ``instructions`` is joined from (a view step may rewrite
    # ``instructions`` from these, e.g. the sanitizer, which judges each upstream under its own policy).
    upstream_instructions: tuple[tuple[str, str], ...] = ()
    # Upstreams down past the health grace (``health.hide_after``): their tools leave the lists (calls to them
    # still resolve and fail fast with -31002, so a client holding an old list gets the true reason).
    unavailable: frozenset[str] = frozenset()


# Turns a freshly merged catalogue into a view; feature modules contribute steps (sanitizing definitions,
# pinning, compiling schemas). Steps run in order, each receiving the previous view.
ViewStep = Callable[[View, Mapping[str, cat.UpstreamLists]], Awaitable[View]]
ChangeListener = Callable[[list[str]], Awaitable[None]]


class Gateway:
    def __init__(self, settings: Settings, *, store: SessionStore, access: AccessControl | None = None) -> None:
        self.settings = settings
        self.store = store
        self.live = LiveSessions(settings.sessions.idle_timeout_s)
        # Assigned by the app once the guards exist (some guards read this gateway's view).
        self.pipeline: Pipeline
        self.access: AccessControl = access or AllowAll()
        self.view = View()
        # Who sees which tools, per view and policy (tools/list reads it; bastion.visibility).
        self.listings = ToolListings()
        self.pool: UpstreamPool | None = None
        self.view_steps: list[ViewStep] = []
        self.change_listeners: list[ChangeListener] = []
        # Called with (public URI, notification params) for every upstream resource update (modern listeners).
        self.resource_listeners: list[Callable[[str, Mapping[str, Any]], None]] = []
        # Clean upstream text on its way to clients outside tool results (progress and log messages, error
        # messages); the sanitizer replaces these identities. Arguments: upstream name, then the payload.
        self.clean_notification: Callable[[str, str, dict[str, Any]], dict[str, Any]] = \
            lambda upstream, method, params: params
        self.clean_error: Callable[[str, dict[str, Any]], dict[str, Any]] = lambda upstream, error: error
        # Results of forwarded prompts/get, resources/read and completion/complete: (upstream, method, result).
        self.clean_result: Callable[[str, str, dict[str, Any]], dict[str, Any]] = \
            lambda upstream, method, result: result
        self.client_request_timeout = 300.0
        # Writes one audit record that is not a tool call (lists, sessions…); the app wires the audit log.
        self.emit_audit: Callable[[dict[str, Any]], Awaitable[None]] = _discard
        self._rebuild_lock = asyncio.Lock()
        # Spans for requests, stages and forwards (bastion.tracing); the app assigns the configured one.
        self.tracing: Tracing = NO_TRACING

    async def forward(self, upstream: str, method: str, params: dict[str, Any],
                      on_message: RelatedMessageHandler | None = None) -> dict[str, Any]:
        """Send one request to an upstream under its configured timeout."""
        if self.pool is None:
            raise UpstreamUnavailable(upstream)
        member = self.pool.member(upstream)
        health = self.pool.monitor
        health.check(upstream)
        try:
            with self.tracing.forward(upstream, method, params) as params:
                result = await member.upstream.request(method, params, timeout=member.timeout_s,
                                                       on_message=on_message)
        except (UpstreamUnavailable, UpstreamTimeout) as exc:
            # Passive health signal. A timeout may be one slow tool: it only starts a probe that tells slow from
            # dead; an unreachable upstream counts towards "down".
            health.failed(upstream, exc.log_detail or exc.message, soft=isinstance(exc, UpstreamTimeout))
            raise
        except UpstreamRpcError as exc:
            health.succeeded(upstream)
            # An upstream's error message reaches the client (and the model): it is upstream text like any other.
            err = self.clean_error(upstream, exc.to_error())
            data = err.get("data")
            raise UpstreamRpcError(exc.code, str(err.get("message", "")),
                                   data=data if isinstance(data, dict) else None,
                                   log_detail=exc.log_detail) from None
        health.succeeded(upstream)
        return result

    async def audit_unknown_tool(self, principal: Principal, name: str, arguments: dict[str, Any], *,
                                 era: Era, session_id: str | None, client_info: Mapping[str, Any] | None,
                                 request_id: str | int | None = None, traceparent: str | None = None) -> None:
        """An unknown tool is a call too: it gets its audit record like every other."""
        await self.audit_refused_call(principal, name, arguments, era=era, session_id=session_id,
                                      client_info=client_info, request_id=request_id, stage="resolve",
                                      outcome="denied", reason="unknown tool", error=UnknownTool(name[:200]),
                                      traceparent=traceparent)

    async def audit_refused_call(self, principal: Principal, tool: ToolEntry | str, arguments: Any, *, era: Era,
                                 session_id: str | None, client_info: Mapping[str, Any] | None,
                                 request_id: str | int | None, stage: str, outcome: Outcome, reason: str,
                                 error: BaseException | None = None, audit_error: str | None = None,
                                 traceparent: str | None = None) -> None:
        """The record of a tools/call refused before its pipeline ran (unknown tool, malformed params, a
        request the parser refused): exactly one per call, like every other. ``tool`` is the entry when the name
        resolved, else the name as sent."""
        # The name as sent, made encodable: it becomes a metrics label too, and a lone surrogate there would break
        # the /metrics page, not just this record.
        entry = tool if isinstance(tool, ToolEntry) else ToolEntry(
            public_name=printable(tool[:200]), upstream="", original_name="", definition={}, upstream_definition={})
        ctx = CallContext(request_id=secrets.token_hex(8), principal=principal, tool=entry,
                          arguments=arguments if isinstance(arguments, dict) else {}, era=era,
                          session_id=session_id, client_info=dict(client_info) if client_info else None,
                          client_id=request_id, traceparent=traceparent)
        record = CallRecord(stage=stage, decision="deny", reason=reason, audit_error=audit_error)
        if arguments is not None and not isinstance(arguments, dict):
            record.audit_error = f"arguments were a JSON {type(arguments).__name__}, not an object: digest of {{}}"
        await self.pipeline.audit(ctx, record, outcome, None, 0.0, error=error)

    @property
    def unprefixed(self) -> Sequence[str]:
        return [u.name for u in self.settings.upstreams if not u.prefix]

    def upstream_of(self, name: str) -> Any:
        for up in self.settings.upstreams:
            if up.name == name:
                return up
        raise KeyError(name)

    async def rebuild(self, lists: Mapping[str, cat.UpstreamLists]) -> None:
        """Merge the upstreams' lists into a new view, swap it in, and announce what changed."""
        async with self._rebuild_lock:
            # In a worker thread: merging tens of thousands of tools is pure CPU, and the loop must keep serving
            # other clients' calls meanwhile (the GIL hands it back every few milliseconds).
            merged = await asyncio.to_thread(cat.build, list(lists.values()),
                                             separator=self.settings.catalogue.separator,
                                             on_collision=self.settings.catalogue.on_collision)
            view = View(catalogue=merged, instructions=self._instructions(),
                        upstream_instructions=self._upstream_instructions(), unavailable=self.view.unavailable)
            for step in self.view_steps:
                view = await step(view, lists)
            old, self.view = self.view, view
            changed = _changes(old, view)
            log.info("catalogue.published", version=view.catalogue.version, tools=len(view.catalogue.tools),
                     quarantined=len(view.quarantined), changed=changed or None)
        if changed and old.catalogue.version != "":
            for listener in self.change_listeners:
                await listener(changed)

    async def set_unavailable(self, upstreams: frozenset[str]) -> None:
        """Hide (or show again) the tools of upstreams the health monitor holds down, and announce it."""
        async with self._rebuild_lock:
            old = self.view
            if old.unavailable == upstreams:
                return
            self.view = dataclasses.replace(old, unavailable=upstreams)
            changed = _changes(old, self.view)
            log.info("catalogue.availability", unavailable=sorted(upstreams), changed=changed or None)
        if changed and old.catalogue.version != "":
            for listener in self.change_listeners:
                await listener(changed)

    async def upstream_event(self, upstream: str, method: str, params: Mapping[str, Any]) -> None:
        """Relay an upstream's resource update to the sessions of this replica subscribed to that resource, and
        its log messages outside any call to the sessions that asked for logging (``server.log_relay``)."""
        if method == "notifications/message":
            self._relay_log(upstream, params)
            return
        if method != "notifications/resources/updated" or not isinstance(params.get("uri"), str):
            return
        prefix = self.upstream_of(upstream).prefix
        public = cat.public_uri(prefix, params["uri"])
        cleaned = self.clean_notification(upstream, method, {**params, "uri": public})
        message = {"jsonrpc": "2.0", "method": method, "params": cleaned}
        for live in self.live.all():
            if public in live.subscriptions and live.get_stream is not None:
                live.get_stream.put_nowait(message)
        for listener in self.resource_listeners:
            listener(public, cleaned)

    def _relay_log(self, upstream: str, params: Mapping[str, Any]) -> None:
        targets = log_targets(self.live.all(), params.get("level"), lambda p: self.may_see_upstream(p, upstream))
        if not targets:
            return
        cleaned = self.clean_notification(upstream, "notifications/message", stamped(upstream, params))
        message = {"jsonrpc": "2.0", "method": "notifications/message", "params": cleaned}
        for live in targets:
            if live.get_stream is not None:
                live.get_stream.put_nowait(message)

    def may_see_upstream(self, principal: Principal, upstream: str) -> bool:
        """Whether anything of ``upstream`` is visible to ``principal`` (a tool, prompt or resource)."""
        catalogue = self.view.catalogue
        return any(t.upstream == upstream and t.public_name not in self.view.quarantined
                   and self.access.tool_visible(principal, t) for t in catalogue.tools) \
            or any(p.upstream == upstream and self.access.prompt_visible(principal, upstream, p.public_name)
                   for p in catalogue.prompts) \
            or any(up == upstream and self.access.resource_visible(principal, up, str(r.get("uri")))
                   for up, r in catalogue.resources)

    def _instructions(self) -> str | None:
        return join_instructions(self._upstream_instructions())

    def _upstream_instructions(self) -> tuple[tuple[str, str], ...]:
        if self.pool is None:
            return ()
        parts = []
        for name in self.pool.names:
            info = self.pool.member(name).upstream.info
            if info is not None and info.instructions:
                parts.append((name, info.instructions))
        return tuple(parts)

    def visible_tools(self, principal: Principal) -> list[ToolEntry]:
        return list(self.listings.listing(self.view, self.access, principal).tools)


def join_instructions(parts: Sequence[tuple[str, str]]) -> str | None:
    """What clients get as ``instructions``: each upstream's, labelled with its name."""
    return "\n\n".join(f"[{name}] {text}" for name, text in parts) or None


async def _discard(record: dict[str, Any]) -> None:
    return None


def _changes(old: View, new: View) -> list[str]:
    changed = []
    if [t.definition for t in old.catalogue.tools if t.public_name not in old.quarantined
        and t.upstream not in old.unavailable] != \
            [t.definition for t in new.catalogue.tools if t.public_name not in new.quarantined
             and t.upstream not in new.unavailable]:
        changed.append("tools")
    if [p.definition for p in old.catalogue.prompts] != [p.definition for p in new.catalogue.prompts]:
        changed.append("prompts")
    if (old.catalogue.resources, old.catalogue.templates) != (new.catalogue.resources, new.catalogue.templates):
        changed.append("resources")
    return changed
