"""``create_app(settings)``: the gateway's HTTP routes and lifespan, over the parts ``assembly.build`` made.

The lifespan starts the pool (connecting upstreams and publishing the first catalogue) before the server accepts
requests, and on shutdown stops accepting, lets in-flight calls finish, then closes upstreams (stdio children
get stdin EOF, SIGTERM, SIGKILL) and flushes the audit sinks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import structlog
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion import collector, hangup
from bastion.approvals.http import approval_routes
from bastion.assembly import Components, build
from bastion.auth import metadata_paths, protected_resource_metadata
from bastion.server.asgi import GatewayApp
from bastion.server.checks import HostGuard
from bastion.sessions.sweep import IndexedRedisSessions
from bastion.settings import Settings
from bastion.stopping import StopRequest, cancel_and_wait

log = structlog.get_logger("bastion.app")


def create_app(settings: Settings) -> Starlette:
    parts = build(settings)
    # Every request on the listener, whatever its path, passes the Host check once, before routing.
    app = GatewayApp(routes=_routes(parts), lifespan=_lifespan(parts), mcp_path=settings.listen.path,
                     mcp_endpoint=parts.endpoint, host_guard=HostGuard(settings.listen),
                     on_refused=parts.endpoint.on_refused)
    app.state.bastion = parts
    return app


def _routes(parts: Components) -> list[Route]:
    settings, pool, monitor, gateway, metrics = parts.settings, parts.pool, parts.monitor, parts.gateway, \
        parts.metrics
    watcher, redis_client = parts.policy_watcher, parts.redis

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        checks: dict[str, Any] = {"upstreams": pool.health(), "upstream_health": monitor.snapshot(public=True),
                                  "catalogue": gateway.view.catalogue.version or None}
        # Ready once some upstream answers and a catalogue was published from it (a view step that failed at
        # start-up leaves none, and serving an empty catalogue would look healthy while being useless).
        ok = any(pool.health().values()) and bool(gateway.view.catalogue.version)
        if watcher is not None:
            # The last good policy stays in force after a broken edit, so readiness holds; the status shows it.
            # Without its error text and file paths: /readyz answers anyone, and a parse error quotes the
            # policy (rule ids, principals, tools). They are in the log and on the admin console.
            status = watcher.status
            checks["policy"] = {"ok": status["ok"], "version": status["version"], "loaded_at": status["loaded_at"],
                                "error": "the policy files on disk are invalid; the last good policy is in force"
                                if status["error"] else None}
        if parts.key_watcher is not None:
            # As for the policy: the last good key table stays in force, readiness holds, the status shows it.
            # Neither the error (it names ids and the file) nor how many keys there are: /readyz answers anyone.
            keys = parts.key_watcher.status
            checks["api_keys"] = {"ok": keys["ok"], "loaded_at": keys["loaded_at"],
                                  "error": "the API key file on disk is invalid; the last good key table is in force"
                                  if keys["error"] else None}
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
        Route(settings.listen.path, parts.endpoint, methods=["GET", "POST", "DELETE"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *approval_routes(parts.approvals, parts.approvals_config, parts.authenticate, parts.events.emit),
    ]
    prm = protected_resource_metadata(parts.auth_config)
    if prm is not None:
        async def prm_endpoint(request: Request) -> Response:
            return JSONResponse(prm)

        routes.extend(Route(p, prm_endpoint, methods=["GET"])
                      for p in metadata_paths(parts.auth_config, settings.listen.path))
    return routes


def _lifespan(parts: Components) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # First: an upstream slow to start must not leave a window in which SIGHUP kills the process.
        remove_hangup = hangup.install(lambda: _hangup(parts))
        parts.stop.bind()
        tasks = []
        if parts.policy_watcher is not None:
            tasks.append(asyncio.create_task(parts.policy_watcher.run(), name="bastion-policy-watcher"))
        if parts.key_watcher is not None:
            tasks.append(asyncio.create_task(parts.key_watcher.run(), name="bastion-key-watcher"))
        if parts.pin_watcher is not None:
            tasks.append(asyncio.create_task(parts.pin_watcher.run(), name="bastion-pin-watcher"))
        try:
            # A stop asked for meanwhile (SIGTERM) ends the start-up where it is: its waits (an upstream that does
            # not answer its initialize, Redis timeouts) would otherwise run their course first, then "ready".
            if await _unless_stopped(_start_up(parts), parts.stop):
                # From now on the collector runs on a clock, not every few hundred allocations (bastion.collector).
                tasks.append(asyncio.create_task(collector.Periodic().run(), name="bastion-collector"))
                log.info("bastion.ready", path=parts.settings.listen.path, upstreams=parts.pool.health(),
                         tools=len(parts.gateway.view.catalogue.tools))
            else:
                # The server sees its own stop flag once this returns and shuts down: through ``finally`` below.
                log.info("bastion.stopped_during_start", upstreams=parts.pool.health())
            yield
        finally:
            if parts.admin is not None:
                await parts.admin.stop()
            await cancel_and_wait(tasks)
            # Before the audit sinks close: each session that dies with this process gets its session.end.
            await parts.approvals.aclose()
            await parts.sweeper.close()
            await parts.pool.close()
            await parts.limiter.aclose()
            await parts.events.flush()
            with contextlib.suppress(Exception):
                await parts.audit_log.close()
            await parts.http.aclose()
            # Last: spans of the calls drained above are exported (bounded by the exporter's own timeout).
            await asyncio.to_thread(parts.tracing.shutdown)
            if isinstance(parts.sessions, IndexedRedisSessions):
                await parts.sessions.aclose()
            if parts.redis_clients is not None:
                await parts.redis_clients.aclose()
            remove_hangup()

    return lifespan


async def _start_up(parts: Components) -> None:
    # Cluster slot map / Sentinel primary discovered now, not inside the first calls' limiter budget.
    if parts.redis_clients is not None and not await parts.redis_clients.warm():
        log.warning("redis.unreachable_at_start")
    for probe in parts.redis_probes:
        await probe()
    # Before serving (uvicorn listens once this returns): one full collection at the end, stalling no client,
    # instead of the many the first catalogue build would set off; then what survived is frozen.
    with collector.start_up():
        await parts.pool.start()
        parts.sweeper.start()
        if parts.admin is not None:
            await parts.admin.start()
        await parts.approvals.start()


async def _unless_stopped(work: Coroutine[Any, Any, None], stop: StopRequest) -> bool:
    """Run ``work`` unless and until a stop is requested: True if it finished, False if the stop came first (then
    it was cancelled, and has finished). Its own failure is raised."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # This coroutine cancelled too (the lifespan ended from outside): take the start-up with it.
        await cancel_and_wait([stopped] + ([] if task.done() else [task]))
    if task.done() and not task.cancelled():
        task.result()
        return True
    return False


def _hangup(parts: Components) -> None:
    """SIGHUP: read the policy files and the API key file now (each watcher's own poll, so never two at once)."""
    config = "read at start only: restart to apply changes to it"
    policy, keys = parts.policy_watcher, parts.key_watcher
    log.info("signal.hangup", policy="reading the policy files now" if policy is not None else "none configured",
             api_keys_file="reading the API key file now" if keys is not None else "none configured",
             config=config)
    if policy is not None:
        policy.request_reload()
    if keys is not None:
        keys.request_reload()
