"""``create_app(settings)``: assemble the gateway and its HTTP routes.

Assembly order follows dependencies: shared clients (httpx, Redis) → stores and sinks → upstreams and pool →
guards and pipeline → front door. The lifespan starts the pool (connecting upstreams and publishing the first
catalogue) before the server accepts requests, and on shutdown stops accepting, lets in-flight calls finish,
then closes upstreams (stdio children get stdin EOF, SIGTERM, SIGKILL) and flushes the audit sinks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion.admin import AdminConfig, AdminConsole, AdminSources, build_console
from bastion.approvals import ApprovalsConfig, ApprovalService
from bastion.approvals.guard import ApprovalGuard
from bastion.approvals.http import approval_routes
from bastion.approvals.store import ApprovalStore, MemoryApprovalStore, RedisApprovalStore
from bastion.audit.config import AuditConfig, build_audit_log
from bastion.audit.hook import CallAuditor
from bastion.audit.log import AuditLog
from bastion.audit.record import (
    AuthFailureReason,
    auth_failure_record,
    catalogue_limit_record,
    policy_reload_record,
    session_record,
)
from bastion.auth import build_authenticator, metadata_paths, protected_resource_metadata
from bastion.auth.config import AuthConfig
from bastion.errors import AuthenticationError
from bastion.flow import FlowRecorder, FlowStore, MemoryFlowStore, RedisFlowStore
from bastion.gateway import Gateway
from bastion.health import Health, HealthConfig, HealthMonitor
from bastion.metrics import Metrics
from bastion.pinning import Pinning, PinningConfig, open_store
from bastion.pinning.service import StoreState
from bastion.pinning.store import PinStore, RedisPinStore
from bastion.pinning.watch import PinWatcher, watch_store
from bastion.pipeline import AuditHook, Pipeline, RequestGuard, ResponseGuard
from bastion.policy import PolicySet, load_policies
from bastion.policy.guard import PolicyAccess, PolicyGuard, PolicyHolder
from bastion.policy.watch import PolicyWatcher
from bastion.pool import Member, UpstreamPool
from bastion.principal import Principal
from bastion.quarantine import QuarantineGuard
from bastion.ratelimit import Limiter, LimiterEvent, RateLimitConfig, build_limiter
from bastion.ratelimit.guard import RateLimitGuard
from bastion.redisconn import ADMIN, RedisClients, open_client
from bastion.refresh_guard import RefreshGateGuard
from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.guard import SanitizeGuard
from bastion.sanitize.result import sanitize_error, sanitize_notification, sanitize_reply
from bastion.sanitize.shape import ResultShapeGuard
from bastion.server.asgi import GatewayApp
from bastion.server.dispatch import Dispatcher
from bastion.server.http import McpEndpoint
from bastion.server.protocol import FrontDoorOptions, FrontDoorProtocol, front_door_protocol
from bastion.server.redis_sessions import RedisSessionStore
from bastion.server.refusals import RefusalReporter
from bastion.server.session_cache import CachedSessionStore
from bastion.server.session_fallback import FallbackSessionStore
from bastion.server.session_sweep import IndexedRedisSessions, SessionSweeper, SweptStore
from bastion.server.sessions import MemorySessionStore, SessionData, SessionStore
from bastion.server.state import StateSealer
from bastion.settings import Settings
from bastion.tracing import build_tracing
from bastion.upstream.config import build_upstream
from bastion.validation import InputSchemaGuard, OutputSchemaGuard, ValidationConfig
from bastion.views import AuditCatalogueDrops, CompileSchemas, PinTools, SanitizeDefinitions, validators_for

log = structlog.get_logger("bastion.app")


@dataclass(slots=True)
class Components:
    """What the lifespan owns; exposed on ``app.state.bastion`` for tests and the admin endpoints."""

    settings: Settings
    gateway: Gateway
    pool: UpstreamPool
    http: httpx.AsyncClient
    redis: aioredis.Redis | None
    metrics: Metrics
    closers: list[Any] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    # The HTTP protocol class for uvicorn (``http=``): the listen limits, reporting refusals as the app does.
    http_protocol: type[FrontDoorProtocol] = FrontDoorProtocol
    # The admin console (``admin:``), on its own listener; None when not configured.
    admin: AdminConsole | None = None
    # Pending human approvals (list/get/decide/subscribe), for the admin API and console.
    approvals: ApprovalService | None = None


def auth_failure_reason(detail: str | None) -> AuthFailureReason:
    """The audit record's failure class, from the authenticator's operator-facing reason."""
    text = (detail or "").lower()
    table: tuple[tuple[str, AuthFailureReason], ...] = (
        ("missing", "missing_credentials"), ("malformed", "malformed_credentials"), ("expired", "expired"),
        ("not yet valid", "not_yet_valid"), ("issuer", "invalid_issuer"), ("audience", "invalid_audience"),
        ("signature", "invalid_signature"), ("unknown", "unknown_key"), ("claim", "missing_claim"),
        ("jwks", "jwks_unavailable"))
    for needle, reason in table:
        if needle in text:
            return reason
    return "other"


class AuditSoon:
    """Write audit records from synchronous code (a watcher callback, a store sweep): scheduled on the running
    loop, and kept referenced until written so none can be garbage-collected half-way."""

    def __init__(self, audit_log: AuditLog) -> None:
        self._audit_log = audit_log
        self._pending: set[asyncio.Task[None]] = set()

    def __call__(self, record: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._audit_log.emit(record))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def flush(self) -> None:
        """Wait for the records scheduled so far (at shutdown, before the sinks close)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


def _redis_sessions(settings: Settings, redis_client: aioredis.Redis, metrics: Metrics,
                    on_expired: Callable[[SessionData], None]) -> IndexedRedisSessions:
    """The Redis session store, layered: index (expiries claimed once) > cache > fallback > Redis."""
    cfg = settings.sessions
    # A Redis outage must not end every session: this replica keeps serving the sessions it has seen (see
    # server/session_fallback.py for the trade-off).
    fallback = FallbackSessionStore(
        RedisSessionStore(redis_client, idle_timeout_s=cfg.idle_timeout_s),
        idle_timeout_s=cfg.idle_timeout_s, max_sessions=cfg.max_sessions, on_event=metrics.session_fallback)
    # In front of it, the sessions Redis confirmed within ``sessions.cache`` are served without a round trip, their
    # touches written behind (server/session_cache.py: a DELETE through another replica takes effect here within
    # that time).
    store: SessionStore = fallback if cfg.cache_s <= 0 else CachedSessionStore(
        fallback, idle_timeout_s=cfg.idle_timeout_s, max_sessions=cfg.max_sessions, trust_s=cfg.cache_s)
    # The index around it all lets expiries be seen and claimed.
    return IndexedRedisSessions(store, redis_client, on_expired=on_expired)


def _policy(settings: Settings, audit_soon: AuditSoon,
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
        audit_soon(policy_reload_record(at=time.time(), outcome="applied", source=",".join(policy.files),
                                        digest=policy.version, rules=len(policy.rules)))

    def rejected(error: str) -> None:
        metrics.policy_reloaded("rejected")
        audit_soon(policy_reload_record(at=time.time(), outcome="rejected",
                                        source=",".join(str(p) for p in settings.policies), error=error,
                                        digest=holder.current.version))

    log.info("policy.loaded", version=holder.current.version, files=list(holder.current.files))
    return holder, PolicyWatcher(settings.policies, reloaded, initial=holder.current, on_failure=rejected)


def _guards(gateway: Gateway, holder: PolicyHolder | None, limiter: Limiter, limits_cfg: RateLimitConfig,
            validation_cfg: ValidationConfig,
            sanitize_cfg: SanitizeConfig,
            flow: FlowStore | None = None,
            approval: RequestGuard | None = None) -> tuple[list[RequestGuard], list[ResponseGuard]]:
    """The tools/call pipeline. Order matters, and each position has its reason:

    - quarantine first: a tool bastion refuses (hostile schema, unapproved definition change) is unknown to
      everyone, whatever the policy says; it costs a dict lookup.
    - policy next: unauthorised callers never touch Redis, the validators or the upstream.
    - approval right after policy, before the rate limit: a call an ``effect: approve`` rule holds waits for a
      person here, holding no concurrency slot and spending no rate budget. A person may take minutes; a slot
      held that long would starve the caller's other calls (and, for a per-tool limit, everyone's), and a call
      that is declined or times out did no work that should count. What bounds the waiting calls instead is the
      approvals caps (``approvals.max_pending``, ``max_pending_per_principal``). An approved call then passes
      the rate limit like any other, so approval never bypasses a limit.
    - rate limit after policy: only authorised attempts count, and it counts every one of them, so argument
      probing against the schema is limited too.
    - input schema after those: invalid arguments never reach the upstream.
    - refresh gate last, right before the forward: a call whose upstream's definitions are being re-checked
      waits for the check, and one whose definition changed after the guards judged it is refused, so nothing
      is forwarded on a definition that was not checked (its verdict is the last step before the transport).

    After the forward: result shape first (a result that is not a CallToolResult cannot be validated or
    sanitized, and capping its content blocks bounds every step after it), then output schema (nothing may trust
    output before it is validated), sanitize last (nothing after it can reintroduce what it removed).
    """
    lookup = validators_for(lambda: gateway.view)
    request_guards: list[RequestGuard] = [QuarantineGuard(lambda: gateway.view.quarantined)]
    if holder is not None:
        request_guards.append(PolicyGuard(holder, flow))
        if approval is not None:
            request_guards.append(approval)
    request_guards += [RateLimitGuard(limiter, limits_cfg), InputSchemaGuard(lookup),
                       RefreshGateGuard(lambda: gateway.pool.gate if gateway.pool is not None else None,
                                        lambda: gateway.view, gateway.settings.catalogue.gate_timeout_s)]
    response_guards: list[ResponseGuard] = [ResultShapeGuard(sanitize_cfg),
                                            OutputSchemaGuard(lookup, validation_cfg.mode_for_tool),
                                            SanitizeGuard(sanitize_cfg)]
    return request_guards, response_guards


def _wire_sanitizer(gateway: Gateway, sanitize_cfg: SanitizeConfig) -> None:
    """Upstream text outside tool results (progress and log messages, questions for the client, errors)."""

    def clean_notification(upstream: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        policy = sanitize_cfg.for_upstream(upstream)
        return sanitize_notification(method, params, policy)[0] if policy.enabled else params

    def clean_error(upstream: str, error: dict[str, Any]) -> dict[str, Any]:
        policy = sanitize_cfg.for_upstream(upstream)
        return sanitize_error(error, policy)[0] if policy.enabled else error

    def clean_result(upstream: str, method: str, result: dict[str, Any]) -> dict[str, Any]:
        policy = sanitize_cfg.for_upstream(upstream)
        return sanitize_reply(method, result, policy)[0] if policy.enabled else result

    gateway.clean_notification = clean_notification
    gateway.clean_error = clean_error
    gateway.clean_result = clean_result


# After a refresh that could not reach the pin store, that upstream is re-checked this soon (not at the next
# periodic refresh, a minute later): tools hidden as unverifiable come back within seconds of the store answering.
PIN_RECHECK_S = 2.0


def _pin_recheck(gateway: Gateway, delay_s: float = PIN_RECHECK_S) -> Callable[[str], None]:
    """Schedule one re-check per upstream at a time; each failed re-check schedules the next."""
    scheduled: set[str] = set()

    def recheck(upstream: str) -> None:
        if upstream in scheduled or gateway.pool is None:
            return
        scheduled.add(upstream)

        def fire() -> None:
            scheduled.discard(upstream)
            if gateway.pool is not None:
                gateway.pool.mark_dirty(upstream)

        asyncio.get_running_loop().call_later(delay_s, fire)

    return recheck


def _pin_store_metrics(metrics: Metrics, store: PinStore) -> Callable[[StoreState], None]:
    redis_backed = isinstance(store, RedisPinStore)
    if redis_backed:
        metrics.set_redis_up("pins", True)

    def on_store(state: StoreState) -> None:
        if state != "ok":
            metrics.pin_store_failed(state)
        if redis_backed:
            metrics.set_redis_up("pins", state == "ok")

    return on_store


def create_app(settings: Settings) -> Starlette:
    http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0),
                             limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
                             follow_redirects=False)
    limits_cfg: RateLimitConfig = settings.section("rate_limits")
    # Every Redis client comes from one factory, with the retry and health-check options its use needs.
    redis_clients = RedisClients.open(settings.redis_url, limiter_timeout_s=limits_cfg.timeout_s) \
        if settings.redis_url else None
    redis_client = redis_clients.shared if redis_clients is not None else None
    metrics = Metrics()

    audit_cfg: AuditConfig = settings.section("audit")
    audit_log = build_audit_log(audit_cfg, redis_client, on_sink_failure=metrics.audit_sink_failed)
    auditor = CallAuditor(audit_log, metrics=metrics)

    audit_soon = AuditSoon(audit_log)
    holder, watcher = _policy(settings, audit_soon, metrics)

    # With Redis, sessions live there so any replica can serve any session; without, in this process.
    def session_end(data: SessionData, reason: str) -> dict[str, Any]:
        now = time.time()
        return session_record("session.end", at=now, session=data.id, era="legacy", principal=None,
                              client_info=dict(data.client_info), protocol_version=data.protocol_version or None,
                              reason=reason, duration_ms=(now - data.created_at) * 1000 if data.created_at else None)

    def session_expired(data: SessionData) -> None:
        # Found by the sweeper (or on access): the end of the session is audited and leaves the gauge.
        metrics.session_closed()
        audit_soon(session_end(data, "expired"))

    async def session_shut_down(data: SessionData) -> None:
        metrics.session_closed()
        await audit_log.emit(session_end(data, "shutdown"))

    store: SweptStore = _redis_sessions(settings, redis_client, metrics, session_expired) \
        if redis_client is not None else \
        MemorySessionStore(settings.sessions.idle_timeout_s, settings.sessions.max_sessions,
                           on_expired=session_expired)
    if redis_client is not None:
        metrics.set_redis_up("sessions", True)  # until an outage says otherwise (the store starts optimistic)
    session_count: dict[str, int] = {}

    def count_sessions(n: int) -> None:
        session_count["n"] = n  # for the admin console's overview
        metrics.set_active_sessions(n)

    sweeper = SessionSweeper(store, settings.sessions.sweep_interval_s, on_count=count_sessions,
                             on_shutdown=session_shut_down)
    gateway = Gateway(settings, store=store, access=PolicyAccess(holder) if holder is not None else None)
    # The limiter gets a Redis client of its own: its timeouts are the short failure-detection ones, which would
    # be wrong for sessions or audit streams.
    limiter_redis = redis_clients.limiter if redis_clients is not None else None

    def on_limiter_event(event: LimiterEvent, limit: str | None) -> None:
        if event in ("redis_unavailable", "redis_recovered"):
            metrics.set_limiter_redis_up(event == "redis_recovered")

    limiter = build_limiter(limits_cfg, limiter_redis, on_event=on_limiter_event)
    if limiter_redis is not None:
        metrics.set_limiter_redis_up(True)  # the limiter starts healthy; its events move the gauge from here

    validation_cfg: ValidationConfig = settings.section("validation")
    sanitize_cfg: SanitizeConfig = settings.section("sanitize")
    # Flow contexts: in Redis when there is one, so every replica decides on the same history.
    flow_store: FlowStore = RedisFlowStore(redis_client) if redis_client is not None else MemoryFlowStore()
    approvals_cfg: ApprovalsConfig = settings.section("approvals") or ApprovalsConfig()
    approval_store: ApprovalStore = RedisApprovalStore(redis_client, open_client(settings.redis_url, ADMIN)) \
        if redis_client is not None and settings.redis_url else MemoryApprovalStore()
    approvals = ApprovalService(approvals_cfg, approval_store)
    approval_guard = ApprovalGuard(approvals, on_outcome=metrics.approval_outcome)
    request_guards, response_guards = _guards(gateway, holder, limiter, limits_cfg, validation_cfg, sanitize_cfg,
                                              flow_store, approval_guard)
    # Schemas compile from what the upstream sent; definitions are sanitized for clients after that.
    gateway.view_steps.extend([CompileSchemas(validation_cfg, metrics),
                               SanitizeDefinitions(sanitize_cfg, emit=audit_log.emit)])
    pinning_cfg: PinningConfig = settings.section("pinning")
    pin_watcher: PinWatcher | None = None
    pinning: Pinning | None = None
    if pinning_cfg.enabled:
        pin_store = open_store(pinning_cfg, redis_client)
        pinning = Pinning(pin_store, pinning_cfg, on_store=_pin_store_metrics(metrics, pin_store))
        gateway.view_steps.append(PinTools(pinning, audit_log, on_degraded=_pin_recheck(gateway)))
        # An admin's approval (CLI, another replica) applies at once: republish from the lists already fetched.
        pin_watcher = watch_store(pin_store, lambda: gateway.pool.republish_soon() if gateway.pool else None)
    # Last: it audits what every step before it dropped or quarantined.
    gateway.view_steps.append(AuditCatalogueDrops(audit_log.emit))

    _wire_sanitizer(gateway, sanitize_cfg)
    audit_hook: AuditHook = auditor if holder is None else \
        FlowRecorder(auditor, lambda: holder.current, flow_store)
    gateway.pipeline = Pipeline(request_guards, response_guards, audit_hook)
    # Off unless configured: then a no-op that never imports the OpenTelemetry SDK.
    tracing = build_tracing(settings.section("tracing"), os.environ)
    gateway.tracing = gateway.pipeline.tracing = tracing

    members = [Member(upstream=build_upstream(cfg, http, on_stray=metrics.upstream_stray_response), prefix=cfg.prefix,
                      timeout_s=min(cfg.timeout, cfg.max_timeout)) for cfg in settings.upstreams if cfg.enabled]
    health_cfg: HealthConfig = settings.section("health")
    monitor = HealthMonitor([m.upstream.name for m in members], health_cfg)

    def health_changed(name: str, old: Health, new: Health) -> None:
        metrics.upstream_health(name, new.state, previous=old.state)

    monitor.on_transition = health_changed
    monitor.on_hidden = gateway.set_unavailable
    pool = UpstreamPool(members, gateway.rebuild, debounce_s=settings.catalogue.refresh_debounce_s,
                        refresh_interval_s=settings.catalogue.refresh_interval_s or None,
                        on_event=gateway.upstream_event, limits=settings.catalogue.limits,
                        on_limit=lambda drop: audit_log.emit(catalogue_limit_record(at=time.time(), drop=drop)),
                        health=monitor, on_refresh=metrics.catalogue_refreshed)
    gateway.pool = pool
    metrics.declare_upstreams([m.upstream.name for m in members])
    for member in members:
        metrics.upstream_health(member.upstream.name, monitor.status(member.upstream.name).state)

    auth_cfg: AuthConfig = settings.section("auth")
    authenticator = build_authenticator(auth_cfg, http)

    async def on_session(event: str, data: SessionData, principal: Principal) -> None:
        if event == "session.start":
            metrics.session_opened()
        else:
            metrics.session_closed()
        await audit_log.emit(session_record(
            "session.start" if event == "session.start" else "session.end", at=time.time(), session=data.id,
            era="legacy", principal=principal, client_info=dict(data.client_info),
            protocol_version=data.protocol_version, reason=None if event == "session.start" else "deleted"))

    async def authenticate(headers: Mapping[str, str], remote_addr: str | None) -> Principal:
        try:
            return await authenticator.authenticate(headers)
        except AuthenticationError as exc:
            log.info("auth.failure", detail=exc.log_detail)
            await audit_log.emit(auth_failure_record(
                at=time.time(), reason=auth_failure_reason(exc.log_detail), method="bearer",
                remote_addr=remote_addr, traceparent=headers.get("traceparent")))
            raise

    gateway.emit_audit = audit_log.emit
    dispatcher = Dispatcher(gateway, StateSealer(settings.sessions.state))
    listen = settings.listen
    refusals = RefusalReporter(count=metrics.http_refused, emit_soon=audit_soon, burst=listen.refusal_audit_burst,
                               per_minute=listen.refusal_audit_per_minute)
    endpoint = McpEndpoint(gateway, dispatcher, authenticate, on_session=on_session, on_refused=refusals.report)
    components = Components(settings=settings, gateway=gateway, pool=pool, http=http, redis=redis_client,
                            metrics=metrics, closers=[audit_log], approvals=approvals)
    components.http_protocol = front_door_protocol(FrontDoorOptions(
        max_header_bytes=listen.max_header_bytes, max_headers=listen.max_headers,
        max_target_bytes=listen.max_target_bytes, request_timeout_s=listen.request_timeout_s,
        report=refusals.report))

    admin_cfg: AdminConfig = settings.section("admin")
    if admin_cfg.enabled:
        components.admin = build_console(admin_cfg, AdminSources(
            gateway=gateway, pool=pool, monitor=monitor, audit_log=audit_log, authenticator=authenticator,
            auth_enabled=auth_cfg.mode != "none", pinning=pinning, policy=holder, policy_watcher=watcher,
            sessions=lambda: session_count.get("n"), started_at=components.started_at, approvals=approvals))
    admin = components.admin

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        checks: dict[str, Any] = {"upstreams": pool.health(), "upstream_health": monitor.snapshot(),
                                  "catalogue": gateway.view.catalogue.version or None}
        # Ready once some upstream answers and a catalogue was published from it (a view step that failed at
        # start-up leaves none, and serving an empty catalogue would look healthy while being useless).
        ok = any(pool.health().values()) and bool(gateway.view.catalogue.version)
        if watcher is not None:
            # The last good policy stays in force after a broken edit, so readiness holds; the status shows it.
            checks["policy"] = watcher.status
        if redis_client is not None:
            # Reported, but not a reason to leave the Service: every Redis use has a declared behaviour while Redis
            # is down (docs/operations.md, "Redis outages"), and with all replicas unready at once a Redis outage
            # would become a total one.
            try:
                async with asyncio.timeout(1.0):
                    await redis_client.ping()
                checks["redis"] = True
            except (TimeoutError, RedisError, OSError):
                checks["redis"] = False
        return JSONResponse({"status": "ready" if ok else "not ready", "checks": checks},
                            status_code=200 if ok else 503)

    async def metrics_endpoint(request: Request) -> Response:
        # bastion_upstream_up follows the health monitor's transitions (upstream_health), not the pool's
        # "connected" flag: a connected upstream that stopped answering is down, and must read 0.
        metrics.set_catalogue_tools(len(gateway.view.catalogue.tools))
        body, content_type = metrics.render(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    routes = [
        Route(settings.listen.path, endpoint, methods=["GET", "POST", "DELETE"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *approval_routes(approvals, approvals_cfg, authenticate, audit_log.emit),
    ]
    prm = protected_resource_metadata(auth_cfg)
    if prm is not None:
        async def prm_endpoint(request: Request) -> Response:
            return JSONResponse(prm)

        routes.extend(Route(p, prm_endpoint, methods=["GET"]) for p in metadata_paths(auth_cfg, settings.listen.path))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = []
        if watcher is not None:
            tasks.append(asyncio.create_task(watcher.run(), name="bastion-policy-watcher"))
        if pin_watcher is not None:
            tasks.append(asyncio.create_task(pin_watcher.run(), name="bastion-pin-watcher"))
        # Cluster slot map / Sentinel primary discovered now, not inside the first calls' limiter budget.
        if redis_clients is not None and not await redis_clients.warm():
            log.warning("redis.unreachable_at_start")
        await pool.start()
        sweeper.start()
        if admin is not None:
            await admin.start()
        await approvals.start()
        log.info("bastion.ready", path=settings.listen.path, upstreams=pool.health(),
                 tools=len(gateway.view.catalogue.tools))
        try:
            yield
        finally:
            if admin is not None:
                await admin.stop()
            for task in tasks:
                task.cancel()
            # Before the audit sinks close: each session that dies with this process gets its session.end.
            await approvals.aclose()
            await sweeper.close()
            await pool.close()
            await limiter.aclose()
            await audit_soon.flush()
            for closer in components.closers:
                with contextlib.suppress(Exception):
                    await closer.close()
            await http.aclose()
            # Last: spans of the calls drained above are exported (bounded by the exporter's own timeout).
            await asyncio.to_thread(tracing.shutdown)
            if isinstance(store, IndexedRedisSessions):
                await store.aclose()
            if redis_clients is not None:
                await redis_clients.aclose()

    app = GatewayApp(routes=routes, lifespan=lifespan, mcp_path=settings.listen.path, mcp_endpoint=endpoint)
    app.state.bastion = components
    return app
