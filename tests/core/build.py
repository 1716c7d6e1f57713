"""Every construction of the core for tests/core, in one place.

The tests in this package drive the real ``Pipeline``, ``Gateway``, ``UpstreamPool``, ``Dispatcher`` and view
steps in this process, over ``tests.support.memory_upstream.MemoryUpstream``. How those objects are constructed
and wired is the one thing expected to change under them (the assembly is being reworked), so no test module
calls a constructor of the core or assigns onto one of its objects: they go through the functions here, and a
change of constructors is absorbed by this file alone.

``running_core`` wires the objects the way ``bastion.assembly.build`` does, with its guard order
(``bastion.guard_list``) and upstream-text cleaner, but with memory stores and sinks instead of Redis, files and
subprocesses.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import yaml

from bastion import catalogue as cat
from bastion import jsonrpc
from bastion.access import AccessControl, AllowAll
from bastion.approvals import ApprovalsConfig, ApprovalService
from bastion.approvals.guard import ApprovalGuard
from bastion.approvals.store import MemoryApprovalStore
from bastion.audit import AuditCatalogueDrops, AuditEvents
from bastion.audit.hook import CallAuditor
from bastion.audit.log import AuditLog
from bastion.audit.sinks import AuditSinkError
from bastion.broadcast import UpstreamBroadcast
from bastion.call import AuditHook, Era, RequestGuard, ResponseGuard
from bastion.changes import CatalogueListener, ChangeFeed
from bastion.flow import MemoryFlowStore
from bastion.gateway import Gateway
from bastion.guard_list import guard_list
from bastion.metrics import Metrics
from bastion.pinning import Pinning, PinningConfig, PinStoreUnavailable, PinTools
from bastion.pinning.model import Pin
from bastion.pinning.store import W
from bastion.pipeline import Pipeline
from bastion.policy.guard import PolicyAccess, PolicyHolder
from bastion.policy.load import PolicyText, compile_policies
from bastion.principal import Principal
from bastion.ratelimit import RateLimitConfig, build_limiter
from bastion.refresh_gate import RefreshRequests
from bastion.sanitize import SanitizeConfig, SanitizeDefinitions, UpstreamTextCleaner
from bastion.server.dispatch import Dispatcher, Scope
from bastion.server.emitter import Emitter, NullEmitter
from bastion.server.state import StateSealer
from bastion.sessions.live import LiveSessions
from bastion.sessions.store import MemorySessionStore
from bastion.settings import Settings, loads
from bastion.tool_entry import ToolEntry
from bastion.upstream_pool import Member, UpstreamPool
from bastion.validation import CompileSchemas, ToolValidators, ValidationConfig, validators_for
from bastion.view import Reusable, View, ViewPublisher, ViewStep
from tests.support.memory_upstream import MemoryUpstream

ALICE = Principal(id="alice", groups=frozenset({"eng"}), auth_method="api_key")
BOB = Principal(id="bob", groups=frozenset({"sales"}), auth_method="api_key")


# -- audit ---------------------------------------------------------------------------------------------------


class MemorySink:
    """A real audit sink (``bastion.audit.sinks.AuditSink``) that keeps every record, as JSON would carry it."""

    name = "memory"

    def __init__(self, *, fail: bool = False) -> None:
        self.docs: list[dict[str, Any]] = []
        self.fail = fail

    async def write(self, record: dict[str, Any]) -> None:
        if self.fail:
            raise AuditSinkError(self.name, "the memory sink was told to fail")
        self.docs.append(orjson.loads(orjson.dumps(record)))

    async def close(self) -> None:
        return None

    def of(self, event: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("event") == event]


def audit_log(*sinks: MemorySink, required: bool = False) -> AuditLog:
    return AuditLog(list(sinks), required=required)


def call_auditor(log: AuditLog) -> CallAuditor:
    return CallAuditor(log)


# -- the pipeline --------------------------------------------------------------------------------------------


def pipeline(request_guards: Sequence[RequestGuard], response_guards: Sequence[ResponseGuard],
             audit: AuditHook) -> Pipeline:
    return Pipeline(request_guards, response_guards, audit)


# -- settings, policy, pins ----------------------------------------------------------------------------------


def settings(upstreams: Mapping[str, Mapping[str, Any]], **config: Any) -> Settings:
    """Settings naming ``upstreams`` (name -> extra keys such as ``prefix`` or ``timeout``). Their ``command`` is
    never run: the pool is given memory upstreams of the same names."""
    doc = {"auth": "none", "listen": {"host": "127.0.0.1", "port": 8080},
           "upstreams": {name: {"command": ["memory-upstream"], **extra} for name, extra in upstreams.items()},
           **config}
    return loads(yaml.safe_dump(doc))


def policy(text: str) -> PolicyHolder:
    """A policy set compiled from one in-memory YAML document."""
    return PolicyHolder(compile_policies([PolicyText("policy.yaml", text)]))


class MemoryPinStore:
    """A real pin store (``bastion.pinning.store.PinStore``) in memory; ``available = False`` makes every
    operation fail as an unreachable Redis does, for the fail-static paths."""

    def __init__(self) -> None:
        self.pins: dict[str, dict[str, Pin]] = {}
        self.available = True
        self.announced: list[str] = []

    def _check(self) -> None:
        if not self.available:
            raise PinStoreUnavailable("memory pin store switched off")

    async def load(self, upstream: str) -> dict[str, Pin]:
        self._check()
        return dict(self.pins.get(upstream, {}))

    async def load_all(self) -> dict[str, dict[str, Pin]]:
        self._check()
        return {up: dict(pins) for up, pins in self.pins.items()}

    async def update(self, upstream: str, plan: Callable[[Mapping[str, Pin]], W]) -> W:
        # One event loop, no await between read and write: atomic, as the contract asks.
        self._check()
        result = plan(dict(self.pins.get(upstream, {})))
        self.pins.setdefault(upstream, {}).update(result.writes)
        return result

    async def announce(self, upstream: str) -> None:
        self.announced.append(upstream)

    async def close(self) -> None:
        return None


def pinning(store: MemoryPinStore, **config: Any) -> Pinning:
    return Pinning(store, PinningConfig.from_mapping(config or None))


# -- view steps and the gateway's catalogue state ------------------------------------------------------------


def compile_schemas(config: Mapping[str, Any] | None = None) -> CompileSchemas:
    return CompileSchemas(ValidationConfig.from_mapping(config or {}), Metrics())


def sanitize_definitions(config: Mapping[str, Any] | None = None,
                         emit: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> SanitizeDefinitions:
    return SanitizeDefinitions(SanitizeConfig.from_mapping(config),
                               AuditEvents(emit) if emit is not None else None)


def pin_tools(pins: Pinning, log: AuditLog, on_degraded: Callable[[str], None] | None = None) -> PinTools:
    return PinTools(pins, AuditEvents(log.emit), on_degraded=on_degraded)


def audit_catalogue_drops(emit: Callable[[dict[str, Any]], Coroutine[Any, Any, None]]) -> AuditCatalogueDrops:
    return AuditCatalogueDrops(AuditEvents(emit))


class FedGateway(Gateway):
    """A gateway whose catalogue the test feeds itself (``rebuild``), through the view publisher it was built on;
    its pool has no upstreams."""

    def __init__(self, config: Settings, publisher: ViewPublisher, changes: ChangeFeed,
                 access: AccessControl | None) -> None:
        super().__init__(config, store=MemorySessionStore(60.0, 100), live=LiveSessions(60.0), views=publisher,
                         pool=UpstreamPool([], publisher.rebuild), changes=changes, access=access,
                         pipeline=Pipeline([], [], CallAuditor(audit_log())))
        self.publisher = publisher


def gateway(config: Settings, steps: Sequence[ViewStep] = (), *, access: AccessControl | None = None) -> FedGateway:
    """A gateway with no upstreams: its catalogue is fed with ``rebuild``."""
    changes = ChangeFeed()
    return FedGateway(config, ViewPublisher((), steps, changes, separator=config.catalogue.separator,
                                            on_collision=config.catalogue.on_collision), changes, access)


def validators_of(gw: Gateway) -> Callable[[ToolEntry], ToolValidators | None]:
    """How the schema guards find a tool's compiled validators in whatever view is current."""
    return validators_for(lambda: gw.view)


def on_change(gw: Gateway, listener: CatalogueListener[View]) -> None:
    gw.changes.subscribe(listener)


async def rebuild(gw: FedGateway, lists: Mapping[str, cat.UpstreamLists]) -> View:
    await gw.publisher.rebuild(lists)
    return gw.view


async def set_unavailable(gw: FedGateway, upstreams: frozenset[str]) -> View:
    await gw.publisher.set_unavailable(upstreams)
    return gw.view


def lists(*upstreams: MemoryUpstream, prefixes: Mapping[str, str | None] | None = None
          ) -> dict[str, cat.UpstreamLists]:
    """What the pool would hand ``rebuild`` for these upstreams (prefix: the upstream's name unless given)."""
    prefixes = prefixes or {}
    return {u.name: cat.UpstreamLists(u.name, prefixes.get(u.name, u.name), tools=list(u.tools),
                                      prompts=list(u.prompts), resources=list(u.resources),
                                      templates=list(u.templates)) for u in upstreams}


# -- the whole core over memory upstreams --------------------------------------------------------------------


@dataclass
class Core:
    """The core as ``create_app`` wires it, over memory upstreams; ``sink`` holds every audit record."""

    settings: Settings
    gateway: Gateway
    pool: UpstreamPool
    dispatcher: Dispatcher
    sink: MemorySink
    upstreams: dict[str, MemoryUpstream]
    pins: MemoryPinStore | None = None
    changes: list[list[str]] = field(default_factory=list)

    @property
    def pipeline(self) -> Pipeline:
        return self.gateway.pipeline

    def records(self, event: str = "tool.call") -> list[dict[str, Any]]:
        return self.sink.of(event)

    async def rpc(self, method: str, params: Mapping[str, Any] | None = None, *, scope: Scope | None = None,
                  rid: jsonrpc.RequestId = 1) -> dict[str, Any]:
        """One request through the dispatcher, as the front door hands it over after parsing. Members the
        dispatcher hands over pre-encoded (tools/list pages: a tuple of ``orjson.Fragment``) are read as a client
        reads them."""
        result = await self.dispatcher.handle(scope or client_scope(), request(method, params, rid))
        return {k: orjson.loads(orjson.dumps(v)) if _encoded(v) else v for k, v in result.items()}

    async def refresh(self) -> None:
        """Fetch every upstream's lists again and publish (``UpstreamPool.refresh_now``)."""
        await self.pool.refresh_now()


def _encoded(value: Any) -> bool:
    return isinstance(value, orjson.Fragment | tuple)  # a tuple is a JSON array to a client


def client_scope(principal: Principal = ALICE, *, era: Era = "legacy",
                 capabilities: Mapping[str, Any] | None = None, emitter: Emitter | None = None,
                 log_level: str | None = None) -> Scope:
    """What the front door establishes for a request (no session: the dispatcher does not need one)."""
    return Scope(principal=principal, era=era, protocol_version="2026-07-28" if era == "modern" else "2025-11-25",
                 client_capabilities=dict(capabilities or {}), client_info={"name": "core-tests", "version": "1"},
                 emitter=emitter or NullEmitter(), log_level=log_level)


def request(method: str, params: Mapping[str, Any] | None = None, rid: jsonrpc.RequestId = 1) -> jsonrpc.Message:
    raw: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        raw["params"] = dict(params)
    return jsonrpc.Message("request", raw)


@contextlib.asynccontextmanager
async def running_core(*upstreams: MemoryUpstream, policy_text: str | None = None,
                       upstream_config: Mapping[str, Mapping[str, Any]] | None = None,
                       **config: Any) -> AsyncIterator[Core]:
    """Build the core over ``upstreams``, start the pool (connect, list, publish the first view), and close it
    all on exit. ``config`` holds top-level config sections (``sanitize``, ``validation``, ``catalogue``...)."""
    upstream_config = upstream_config or {}
    conf = settings({u.name: upstream_config.get(u.name, {}) for u in upstreams}, **config)
    sink = MemorySink()
    log = audit_log(sink)
    events = AuditEvents(log.emit)
    holder = policy(policy_text) if policy_text is not None else None
    access: AccessControl = PolicyAccess(holder) if holder else AllowAll()
    limits_cfg: RateLimitConfig = conf.section("rate_limits")
    validation_cfg: ValidationConfig = conf.section("validation")
    sanitize_cfg: SanitizeConfig = conf.section("sanitize")
    approvals = ApprovalService(conf.section("approvals") or ApprovalsConfig(), MemoryApprovalStore())
    limiter = build_limiter(limits_cfg, None)
    by_name = {u.name: u for u in upstreams}
    members = [Member(upstream=u, prefix=cfg.prefix, timeout_s=min(cfg.timeout, cfg.max_timeout))
               for cfg in conf.upstreams if (u := by_name.get(cfg.name)) is not None]
    requests, changes = RefreshRequests(), ChangeFeed()
    steps: list[ViewStep] = [Reusable(CompileSchemas(validation_cfg, Metrics())),
                             Reusable(SanitizeDefinitions(sanitize_cfg, events))]
    pin_store: MemoryPinStore | None = None
    pinning_cfg: PinningConfig = conf.section("pinning")
    if pinning_cfg.enabled:
        pin_store = MemoryPinStore()
        steps.append(PinTools(Pinning(pin_store, pinning_cfg), events))
    steps.append(AuditCatalogueDrops(events))
    views = ViewPublisher([m.upstream for m in members], steps, changes, separator=conf.catalogue.separator,
                          on_collision=conf.catalogue.on_collision)
    request_guards, response_guards = guard_list(
        lambda: views.view, requests.gate, conf.catalogue.gate_timeout_s, holder, limiter, limits_cfg,
        validation_cfg, sanitize_cfg, MemoryFlowStore(), ApprovalGuard(approvals))
    cleaner = UpstreamTextCleaner(sanitize_cfg)
    live = LiveSessions(conf.sessions.idle_timeout_s)
    broadcast = UpstreamBroadcast({u.name: u.prefix for u in conf.upstreams}, live, lambda: views.view, access,
                                  cleaner.clean_notification, changes)
    pool = UpstreamPool(members, views.rebuild, debounce_s=0.01, refresh_interval_s=None, on_event=broadcast,
                        limits=conf.catalogue.limits, health=conf.section("health"), on_hidden=views.set_unavailable,
                        requests=requests)
    gw = Gateway(conf, store=MemorySessionStore(60.0, 100), live=live, views=views, pool=pool,
                 pipeline=Pipeline(request_guards, response_guards, CallAuditor(log)), changes=changes,
                 access=access, cleaner=cleaner, emit_audit=events.emit)
    core = Core(settings=conf, gateway=gw, pool=pool, dispatcher=Dispatcher(gw, StateSealer(conf.sessions.state)),
                sink=sink, upstreams=dict(by_name), pins=pin_store)

    async def record_change(changed: list[str], old: View, new: View) -> None:
        core.changes.append(changed)

    changes.subscribe(record_change)
    await pool.start()
    try:
        yield core
    finally:
        await pool.close()
        await limiter.aclose()
        await approvals.aclose()
