"""``build(settings)``: every part of a running gateway, constructed once, in one place, in dependency order.

Each object receives its collaborators in its constructor and nothing is assigned onto it afterwards, so reading
a constructor says what an object needs. The order follows the dependencies, and the few loops between parts
are broken by small objects built before both sides:

1. shared clients (httpx, Redis) and metrics;
2. audit (the log and ``AuditEvents``, which every later part writes through), the policy and its watcher;
3. sessions (stores and the sweeper), the rate limiter, flows and approvals;
4. the upstreams (not connected yet), the refresh requests (``refresh_gate.RefreshRequests``: the pool's inbox,
   which the pin re-check and the pin watcher write to without needing the pool) and the change feed
   (``changes.ChangeFeed``: what the front door announces, which it subscribes to without the core needing it);
5. the view steps and the ``ViewPublisher`` that runs them (the catalogue state the guards read);
6. the guard list (``guard_list``) and the pipeline with its tracing;
7. the broadcast of upstream notifications, the pool (which publishes through the view publisher and builds the
   health monitor it probes for), and the ``Gateway`` over all of them;
8. the front door (authentication, dispatcher, MCP endpoint, HTTP protocol) and the admin console.

Nothing here does I/O or starts a task: ``bastion.app`` starts and stops what this builds, in its lifespan.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import httpx
import redis.asyncio as aioredis
import structlog
from starlette.types import ASGIApp

from bastion.access import AccessControl, AllowAll
from bastion.admin import AdminConfig, AdminConsole, AdminSources, build_console
from bastion.approvals import ApprovalsConfig, ApprovalService
from bastion.approvals.guard import ApprovalGuard
from bastion.approvals.store import ApprovalStore, MemoryApprovalStore, RedisApprovalStore
from bastion.audit import AuditCatalogueDrops, AuditConfig, AuditEvents, AuditLog, CallAuditor, build_audit_log
from bastion.auth import KeyRing, build_authenticator, key_ring
from bastion.auth.apikeys import ApiKeyTable
from bastion.auth.config import AuthConfig
from bastion.auth.keyfile import KeyWatcher
from bastion.auth.known import PrincipalDirectory
from bastion.broadcast import UpstreamBroadcast
from bastion.call import AuditHook
from bastion.catalogue import Naming
from bastion.changes import ChangeFeed
from bastion.errors import AuditUnavailable, AuthenticationError
from bastion.flow import FlowRecorder, FlowStore, MemoryFlowStore, RedisFlowStore
from bastion.gateway import Gateway
from bastion.guard_list import guard_list
from bastion.health import Health, HealthConfig, HealthMonitor
from bastion.metrics import Metrics
from bastion.pinning import (
    Pinning,
    PinningConfig,
    PinRecheck,
    PinStore,
    PinTools,
    PinWatcher,
    RedisPinStore,
    open_store,
    watch_store,
)
from bastion.pinning.service import StoreState
from bastion.pipeline import Pipeline
from bastion.policy import PolicySet, load_policies
from bastion.policy.guard import PolicyAccess, PolicyHolder
from bastion.policy.watch import PolicyWatcher
from bastion.principal import Principal
from bastion.ratelimit import Limiter, LimiterEvent, RateLimitConfig, build_limiter
from bastion.ratelimit.forwarded import ForwardedLimits
from bastion.ratelimit.redis_limiter import RedisLimiter
from bastion.redisconn import ADMIN, RedisClients, open_client
from bastion.refresh_gate import RefreshRequests
from bastion.sanitize import SanitizeConfig, SanitizeDefinitions, UpstreamTextCleaner
from bastion.server.asgi import Guarded, OnRefused
from bastion.server.checks import HostGuard
from bastion.server.dispatch import Dispatcher
from bastion.server.http import McpEndpoint
from bastion.server.protocol import FrontDoorOptions, FrontDoorProtocol, front_door_protocol
from bastion.server.refusals import RefusalReporter
from bastion.server.standing import AuthChanges, Standing
from bastion.server.state import StateSealer
from bastion.sessions.cache import CachedSessionStore
from bastion.sessions.fallback import FallbackSessionStore
from bastion.sessions.live import LiveSessions
from bastion.sessions.redis_store import RedisSessionStore
from bastion.sessions.store import MemorySessionStore, SessionData, SessionStore
from bastion.sessions.sweep import IndexedRedisSessions, SessionSweeper, SweptStore
from bastion.settings import ListenConfig, Settings
from bastion.stopping import StopRequest
from bastion.tracing import Tracing, build_tracing
from bastion.upstream.config import build_upstream
from bastion.upstream.httpio import upstream_client
from bastion.upstream_pool import Member, UpstreamPool
from bastion.validation import CompileSchemas, ValidationConfig
from bastion.view import Reusable, View, ViewPublisher, ViewStep

log = structlog.get_logger("bastion.app")

# Checks a request's credentials: (headers, remote address) -> the principal, or AuthenticationError.
Authenticate = Callable[[Mapping[str, str], str | None], Awaitable[Principal]]


@dataclass(frozen=True, slots=True)
class Components:
    """Every part of the running gateway; the lifespan starts and stops them, the routes read them.

    Exposed on ``app.state.bastion`` for tests and the admin endpoints.
    """

    settings: Settings
    started_at: float
    http: httpx.AsyncClient
    redis_clients: RedisClients | None
    metrics: Metrics
    audit_log: AuditLog
    events: AuditEvents
    policy_watcher: PolicyWatcher | None
    # Re-reads ``auth.api_keys_file`` into the authenticator's key ring; None without a key file.
    key_watcher: KeyWatcher | None
    sessions: SweptStore
    sweeper: SessionSweeper
    limiter: Limiter
    approvals: ApprovalService
    approvals_config: ApprovalsConfig
    pin_watcher: PinWatcher | None
    tracing: Tracing
    monitor: HealthMonitor
    pool: UpstreamPool
    gateway: Gateway
    auth_config: AuthConfig
    authenticate: Authenticate
    endpoint: McpEndpoint
    # The HTTP protocol class for uvicorn (``http=``): the listen limits, reporting refusals as the app does.
    http_protocol: type[FrontDoorProtocol]
    # The admin console (``admin:``), on its own listener; None when not configured.
    admin: AdminConsole | None
    # One real operation per Redis use, run once at start-up before serving: each health gauge starts from what
    # it measured (``bastion_redis_up{use}``, ``bastion_limiter_redis_up``), never from an assumption.
    redis_probes: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # A stop (SIGTERM) asked for by the server: the lifespan's start-up gives way to it (``app.serve``).
    stop: StopRequest = field(default_factory=StopRequest)

    @property
    def redis(self) -> aioredis.Redis | None:
        """The shared Redis client (sessions, audit streams, flows…); None without ``redis_url``."""
        return self.redis_clients.shared if self.redis_clients is not None else None


def build(settings: Settings) -> Components:
    started_at = time.time()
    # Shared by every HTTP upstream and the JWKS fetch: it keeps no cookies and bounds every answer's head.
    http = upstream_client()
    limits_cfg: RateLimitConfig = settings.section("rate_limits")
    # Every Redis client comes from one factory, with the retry and health-check options its use needs.
    redis_clients = RedisClients.open(settings.redis_url, limiter_timeout_s=limits_cfg.timeout_s,
                                      lean=limits_cfg.redis_client == "fast") \
        if settings.redis_url else None
    redis_client = redis_clients.shared if redis_clients is not None else None
    metrics = Metrics()

    audit_cfg: AuditConfig = settings.section("audit")
    audit_log = build_audit_log(audit_cfg, redis_client, on_sink_failure=metrics.audit_sink_failed)
    events = AuditEvents(audit_log.emit)
    holder, watcher = _policy(settings, events, metrics)
    # Every way a session ends ends its live state here too (streams, subscriptions, log relay).
    live = LiveSessions(settings.sessions.idle_timeout_s)
    redis_probes: list[Callable[[], Awaitable[None]]] = []
    store, sweeper, session_count = _sessions(settings, redis_client, events, metrics, live, redis_probes)
    # Lists, calls and relayed notifications all ask the same access policy.
    access: AccessControl = PolicyAccess(holder) if holder is not None else AllowAll()
    limiter = _limiter(limits_cfg, redis_clients, metrics, redis_probes)

    # Flow contexts: in Redis when there is one, so every replica decides on the same history.
    flow_store: FlowStore = RedisFlowStore(redis_client) if redis_client is not None else MemoryFlowStore()
    approvals_cfg: ApprovalsConfig = settings.section("approvals") or ApprovalsConfig()
    approval_store: ApprovalStore = RedisApprovalStore(redis_client, open_client(settings.redis_url, ADMIN)) \
        if redis_client is not None and settings.redis_url else MemoryApprovalStore()
    approvals = ApprovalService(approvals_cfg, approval_store)

    members = [Member(upstream=build_upstream(cfg, http, on_stray=metrics.upstream_stray_response,
                                             on_stderr=metrics.upstream_stderr,
                                             on_refused=metrics.upstream_server_request_refused), prefix=cfg.prefix,
                      timeout_s=min(cfg.timeout, cfg.max_timeout)) for cfg in settings.upstreams if cfg.enabled]
    requests = RefreshRequests()
    changes: ChangeFeed[View] = ChangeFeed()

    validation_cfg: ValidationConfig = settings.section("validation")
    sanitize_cfg: SanitizeConfig = settings.section("sanitize")
    # Schemas compile from what the upstream sent; definitions are sanitized for clients after that.
    # Both depend on the lists alone: a refresh that fetched the same lists reuses what they made (``Reusable``).
    steps: list[ViewStep] = [Reusable(CompileSchemas(validation_cfg, metrics)),
                             Reusable(SanitizeDefinitions(sanitize_cfg, events))]
    pinning_cfg: PinningConfig = settings.section("pinning")
    pin_watcher: PinWatcher | None = None
    pinning: Pinning | None = None
    if pinning_cfg.enabled:
        pin_store = open_store(pinning_cfg, redis_client)
        pinning = Pinning(pin_store, pinning_cfg, on_store=_pin_store_metrics(metrics, pin_store))
        steps.append(PinTools(pinning, events, on_degraded=PinRecheck(requests)))
        # An admin's approval (CLI, another replica) applies at once: republish from the lists already fetched.
        pin_watcher = watch_store(pin_store, requests.republish_soon)
    # Last: it audits what every step before it dropped or quarantined.
    steps.append(AuditCatalogueDrops(events))
    views = ViewPublisher([m.upstream for m in members], steps, changes, separator=settings.catalogue.separator,
                          on_collision=settings.catalogue.on_collision)

    request_guards, response_guards = guard_list(
        lambda: views.view, requests.gate, settings.catalogue.gate_timeout_s, holder, limiter, limits_cfg,
        validation_cfg, sanitize_cfg, flow_store, ApprovalGuard(approvals, on_outcome=metrics.approval_outcome))
    # Logged arguments pass the sanitizer's secret rules, as docs/audit.md says they do.
    auditor = CallAuditor(audit_log, metrics=metrics, redact=sanitize_cfg.redact_text)
    audit_hook: AuditHook = auditor if holder is None else \
        FlowRecorder(auditor, lambda: holder.current, flow_store)
    # Off unless configured: then a no-op that never imports the OpenTelemetry SDK.
    tracing = build_tracing(settings.section("tracing"), os.environ)
    pipeline = Pipeline(request_guards, response_guards, audit_hook, tracing=tracing)

    health_cfg: HealthConfig = settings.section("health")
    restarts: dict[str, int] = {}

    def health_changed(name: str, old: Health, new: Health) -> None:
        metrics.upstream_health(name, new.state, previous=old.state)
        if new.state == "restarting":
            restarts[name] = restarts.get(name, 0) + 1  # for the admin console's overview

    cleaner = UpstreamTextCleaner(sanitize_cfg)
    broadcast = UpstreamBroadcast({u.name: u.prefix for u in settings.upstreams}, live, lambda: views.view,
                          access, cleaner.clean_notification, changes)
    pool = UpstreamPool(members, views.rebuild, debounce_s=settings.catalogue.refresh_debounce_s,
                        refresh_interval_s=settings.catalogue.refresh_interval_s or None, on_event=broadcast,
                        limits=settings.catalogue.limits, on_limit=events.catalogue_limit, health=health_cfg,
                        on_health=health_changed, on_hidden=views.set_unavailable,
                        on_refresh=metrics.catalogue_refreshed, requests=requests)
    monitor = pool.monitor
    metrics.declare_upstreams([m.upstream.name for m in members])
    for member in members:
        metrics.upstream_health(member.upstream.name, monitor.status(member.upstream.name).state)
    gateway = Gateway(settings, store=store, live=live, views=views, pool=pool, pipeline=pipeline, changes=changes,
                      access=access, cleaner=cleaner, emit_audit=events.emit, tracing=tracing,
                      forwarded_limits=ForwardedLimits(limiter, limits_cfg), redact_text=sanitize_cfg.redact_text)
    gateway.relay_dropped = metrics.relay_dropped
    gateway.rate_limited = metrics.ratelimit_rejected

    auth_cfg: AuthConfig = settings.section("auth")
    keys = key_ring(auth_cfg)
    # Each key table swapped in wakes every open stream to present its credential again (server/standing.py).
    auth_changes = AuthChanges()
    key_watcher = _key_watcher(auth_cfg, keys, metrics, auth_changes)
    authenticator = build_authenticator(auth_cfg, http, keys)

    async def on_session(event: str, data: SessionData, principal: Principal, reason: str | None) -> None:
        if event == "session.start":
            # Counted from the moment the store holds it: the sweeper sets the gauge from the store's own count,
            # and an increment made after the record's write (an await) added a session the sweeper had already
            # counted, one too many until the next sweep.
            metrics.session_opened()
            try:
                await events.session_started(data.id, era="legacy", principal=principal,
                                             client_info=data.client_info, protocol_version=data.protocol_version)
            except AuditUnavailable:
                metrics.session_closed()  # refused: its session is removed (server/lifecycle.py)
                # The initialize is refused and its session removed (server/lifecycle.py): the sinks that did
                # take the start record get its end, so no reader of the trail counts it as open.
                with contextlib.suppress(AuditUnavailable):  # the sink that failed fails again
                    await events.session_ended(data.id, era="legacy", principal=principal,
                                               client_info=data.client_info, protocol_version=data.protocol_version,
                                               reason="refused", created_at=data.created_at)
                raise
            metrics.session_started()
        else:
            metrics.session_closed()
            await events.session_ended(data.id, era="legacy", principal=principal, client_info=data.client_info,
                                       protocol_version=data.protocol_version, reason=reason or "deleted")

    async def authenticate(headers: Mapping[str, str], remote_addr: str | None) -> Principal:
        try:
            return await authenticator.authenticate(headers)
        except AuthenticationError as exc:
            log.info("auth.failure", detail=exc.log_detail)
            await events.auth_failed(exc.log_detail, method="bearer", remote_addr=remote_addr,
                                     traceparent=headers.get("traceparent"))
            raise

    async def revoked(standing: Standing, detail: str | None) -> None:
        # A stream's credential, presented again, no longer authenticates (server/standing.py): the record names
        # whose stream it was.
        log.info("auth.failure", detail=detail, stage="stream", principal=standing.principal.id)
        await events.auth_failed(detail, method="bearer", remote_addr=standing.remote_addr,
                                 traceparent=standing.headers.get("traceparent"), principal=standing.principal,
                                 session=standing.session, era=standing.era)

    listen = settings.listen
    refusals = RefusalReporter(count=metrics.http_refused, emit_soon=events.soon, burst=listen.refusal_audit_burst,
                               per_minute=listen.refusal_audit_per_minute)
    endpoint = McpEndpoint(gateway, Dispatcher(gateway, StateSealer(settings.sessions.state)), authenticate,
                           on_session=on_session, on_refused=refusals.report,
                           reauthenticate=authenticator.authenticate, on_revoked=revoked,
                           auth_changes=auth_changes if key_watcher is not None else None)
    http_protocol = front_door_protocol(FrontDoorOptions(
        max_header_bytes=listen.max_header_bytes, max_headers=listen.max_headers,
        max_target_bytes=listen.max_target_bytes, request_timeout_s=listen.request_timeout_s,
        report=refusals.report))

    admin_cfg: AdminConfig = settings.section("admin")
    admin = build_console(admin_cfg, AdminSources(
        view=lambda: views.view, pool=pool, monitor=monitor, audit_log=audit_log, authenticator=authenticator,
        auth_enabled=auth_cfg.mode != "none", pinning=pinning, policy=holder, policy_watcher=watcher,
        approvals=approvals, principals=PrincipalDirectory.from_auth(auth_cfg), keys=keys,
        naming=Naming.of(settings.upstreams, settings.catalogue.separator), sessions=lambda: session_count.get("n"),
        started_at=started_at, restarts=restarts, redis=redis_client), guard=_host_guard(admin_cfg, refusals.report)) \
        if admin_cfg.enabled else None

    return Components(
        settings=settings, started_at=started_at, http=http, redis_clients=redis_clients, metrics=metrics,
        audit_log=audit_log, events=events, policy_watcher=watcher, key_watcher=key_watcher, sessions=store,
        sweeper=sweeper, limiter=limiter, approvals=approvals, approvals_config=approvals_cfg, pin_watcher=pin_watcher,
        tracing=tracing,
        monitor=monitor, pool=pool, gateway=gateway, auth_config=auth_cfg, authenticate=authenticate,
        endpoint=endpoint, http_protocol=http_protocol, admin=admin, redis_probes=redis_probes)


def _policy(settings: Settings, events: AuditEvents,
            metrics: Metrics) -> tuple[PolicyHolder | None, PolicyWatcher | None]:
    """The policy in force and its watcher; fails hard at start-up, since a gateway must never serve with a
    policy it could not read. Reloads, applied or rejected, are counted and audited."""
    if not settings.policies:
        log.warning("policy.disabled", detail="no 'policies' configured: every authenticated principal may call "
                    "every tool")
        return None, None
    holder = PolicyHolder(load_policies(settings.policies))

    def reloaded(policy: PolicySet) -> None:
        holder.swap(policy)
        metrics.policy_reloaded("applied")
        events.policy_reloaded_soon("applied", source=",".join(policy.files), digest=policy.version,
                                    rules=len(policy.rules))

    def rejected(error: str) -> None:
        metrics.policy_reloaded("rejected")
        events.policy_reloaded_soon("rejected", source=",".join(str(p) for p in settings.policies), error=error,
                                    digest=holder.current.version)

    def recovered(policy: PolicySet) -> None:
        # The files read as the set in force again: the rejected edit is over, and the record says so.
        metrics.policy_reloaded("unchanged")
        events.policy_reloaded_soon("unchanged", source=",".join(policy.files), digest=policy.version,
                                    rules=len(policy.rules))

    log.info("policy.loaded", version=holder.current.version, files=list(holder.current.files))
    return holder, PolicyWatcher(settings.policies, reloaded, initial=holder.current, on_failure=rejected,
                                 on_recovered=recovered)


def _key_watcher(cfg: AuthConfig, keys: KeyRing | None, metrics: Metrics,
                 changes: AuthChanges) -> KeyWatcher | None:
    """The watcher of ``auth.api_keys_file``, swapping each table it loads into ``keys`` (``auth.keyfile``) and
    counting it in ``changes``, which wakes the open streams to check their credentials against it."""
    if keys is None or cfg.api_keys_file is None:
        return None

    def reloaded(table: ApiKeyTable) -> None:
        keys.swap(table)
        changes.advance()
        metrics.api_keys_reloaded("applied")

    return KeyWatcher(cfg.api_keys_file, reloaded, inline=keys.inline, initial=keys.table,
                      on_failure=lambda _: metrics.api_keys_reloaded("rejected"),
                      on_recovered=lambda _: metrics.api_keys_reloaded("unchanged"))


def _sessions(settings: Settings, redis_client: aioredis.Redis | None, events: AuditEvents,
              metrics: Metrics, live: LiveSessions,
              probes: list[Callable[[], Awaitable[None]]]) -> tuple[SweptStore, SessionSweeper, dict[str, int]]:
    """The session store (with Redis, sessions live there so any replica can serve any session; without, in this
    process), its sweeper, and the sweeper's last count (for the admin console's overview)."""
    cfg = settings.sessions

    def ended(reason: str) -> Callable[[SessionData], None]:
        def session_ended(data: SessionData) -> None:
            # Found by the sweeper (or on access), or a principal's quota ended it: its stream and subscriptions
            # on this replica end with it, its end is audited and it leaves the gauge.
            live.end(data.id)
            metrics.session_closed()
            events.session_ended_soon(data.id, era="legacy", principal=None, client_info=data.client_info,
                                      protocol_version=data.protocol_version or None, reason=reason,
                                      created_at=data.created_at)
        return session_ended

    session_expired, session_evicted = ended("expired"), ended("evicted")

    async def session_shut_down(data: SessionData) -> None:
        metrics.session_closed()
        await events.session_ended(data.id, era="legacy", principal=None, client_info=data.client_info,
                                   protocol_version=data.protocol_version or None, reason="shutdown",
                                   created_at=data.created_at)

    store: SweptStore = _redis_sessions(settings, redis_client, metrics, session_expired, session_evicted, probes) \
        if redis_client is not None else \
        MemorySessionStore(cfg.idle_timeout_s, cfg.max_sessions, max_per_principal=cfg.max_per_principal,
                           on_expired=session_expired, on_evicted=session_evicted)
    session_count: dict[str, int] = {}

    def count_sessions(n: int) -> None:
        session_count["n"] = n
        metrics.set_active_sessions(n)

    return store, SessionSweeper(store, cfg.sweep_interval_s, on_count=count_sessions,
                                 on_shutdown=session_shut_down), session_count


def _redis_sessions(settings: Settings, redis_client: aioredis.Redis, metrics: Metrics,
                    on_expired: Callable[[SessionData], None],
                    on_evicted: Callable[[SessionData], None],
                    probes: list[Callable[[], Awaitable[None]]]) -> IndexedRedisSessions:
    """The Redis session store, layered: index (expiries claimed once) > cache > fallback > Redis."""
    cfg = settings.sessions
    # A Redis outage must not end every session: this replica keeps serving the sessions it has seen (see
    # sessions/fallback.py for the trade-off).
    fallback = FallbackSessionStore(
        RedisSessionStore(redis_client, idle_timeout_s=cfg.idle_timeout_s),
        idle_timeout_s=cfg.idle_timeout_s, max_sessions=cfg.max_sessions, on_event=metrics.session_fallback)

    async def measure_sessions() -> None:
        # From here on the store's outage edges (unavailable/recovered) move the gauge.
        metrics.set_redis_up("sessions", await fallback.measure())

    probes.append(measure_sessions)
    # In front of it, the sessions Redis confirmed within ``sessions.cache`` are served without a round trip, their
    # touches written behind (sessions/cache.py: a DELETE through another replica takes effect here within
    # that time).
    store: SessionStore = fallback if cfg.cache_s <= 0 else CachedSessionStore(
        fallback, idle_timeout_s=cfg.idle_timeout_s, max_sessions=cfg.max_sessions, trust_s=cfg.cache_s)
    # The index around it all lets expiries be seen and claimed, and bounds each principal's share.
    return IndexedRedisSessions(store, redis_client, on_expired=on_expired, max_per_principal=cfg.max_per_principal,
                                idle_timeout_s=cfg.idle_timeout_s, on_evicted=on_evicted)


def _limiter(cfg: RateLimitConfig, redis_clients: RedisClients | None, metrics: Metrics,
             probes: list[Callable[[], Awaitable[None]]]) -> Limiter:
    # The limiter gets a Redis client of its own: its timeouts are the short failure-detection ones, which would
    # be wrong for sessions or audit streams.
    limiter_redis = redis_clients.limiter if redis_clients is not None else None

    def on_limiter_event(event: LimiterEvent, limit: str | None) -> None:
        if event in ("redis_unavailable", "redis_recovered"):
            metrics.set_limiter_redis_up(event == "redis_recovered")

    limiter = build_limiter(cfg, limiter_redis, on_event=on_limiter_event,
                            scripts=redis_clients.limiter_scripts if redis_clients is not None else None)
    if isinstance(limiter, RedisLimiter):
        redis_limiter = limiter

        async def measure_limiter() -> None:
            # Its script load, through its own client: from here on its outage events move the gauges.
            metrics.set_limiter_redis_up(await redis_limiter.measure())

        probes.append(measure_limiter)
    return limiter


def _pin_store_metrics(metrics: Metrics, store: PinStore) -> Callable[[StoreState], None]:
    # No value until the store's first operation (the first catalogue build, before the gateway serves) says.
    redis_backed = isinstance(store, RedisPinStore)

    def on_store(state: StoreState) -> None:
        if state != "ok":
            metrics.pin_store_failed(state)
        if redis_backed:
            metrics.set_redis_up("pins", state == "ok")

    return on_store


def _host_guard(cfg: AdminConfig, on_refused: OnRefused) -> Callable[[ASGIApp], ASGIApp]:
    """The admin console's listener behind the same Host check as the gateway's (DNS rebinding: without ``auth``
    the console trusts loopback peers, and a page on a rebound name is one), its refusals counted alike."""
    listen = ListenConfig(host=cfg.host, port=cfg.port, allowed_hosts=cfg.allowed_hosts)
    return lambda app: Guarded(app, HostGuard(listen), on_refused)
