"""The console's Starlette app: login, the pages, the live streams, and the admin actions (pins, approvals,
explain).

Every request passes the listener's Host check first (``guard``: ``HostGuard``, as on the gateway's listener, wired
by the assembly): a loopback console answers only to loopback names and ``admin.allowed_hosts`` (421 otherwise), or
a page on a rebound DNS name could log in as ``loopback-admin`` (without ``auth``, the console trusts loopback
peers, and a browser tricked by DNS rebinding is one) and approve pins and held calls.

Every response carries the security headers (strict CSP: scripts and styles only from bastion itself, no inline
code; no framing; no caching; no referrer). Every page needs a valid session cookie; every POST but the login
needs the session's CSRF token as well; the login POST needs the login form's signed double-submit token.

A session is valid while its signature checks, its expiry has not passed and it was not revoked (logout:
``revocation.Revocations``), and that is asked wherever a session is accepted: each page, form and partial, and
each live stream again at every keep-alive tick and before anything it sends; a stream also ends the moment its
session expires or is revoked on this replica. Authorisation at connection start alone would let a stream opened
before a logout, or shortly before the expiry, follow the audit log for as long as the browser stays.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
import structlog
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from bastion.admin import pages
from bastion.admin.config import AdminConfig, is_loopback
from bastion.admin.revocation import Revocations
from bastion.admin.session import COOKIE, LOGIN_COOKIE, AdminSession, Signer, csrf_ok
from bastion.admin.sources import AdminSources
from bastion.admin.tap import AuditTap
from bastion.approvals import ApprovalEvent, NotAnApprover
from bastion.audit.record import admin_action_record, approval_record, pin_approve_record
from bastion.auth import hash_key
from bastion.auth.known import ResolvedPrincipal
from bastion.catalogue import Naming
from bastion.errors import AuthenticationError
from bastion.pinning.errors import PinningError, PinStoreUnavailable
from bastion.policy.cases import tool_entry
from bastion.policy.explain import decision_json
from bastion.principal import Principal
from bastion.stopping import cancel_and_wait

log = structlog.get_logger("bastion.admin")

HERE = Path(__file__).parent
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff",
                    "x-frame-options": "DENY", "referrer-policy": "no-referrer", "cache-control": "no-store"}
# Fields of the live stream's filter, in the order the form shows them.
FILTERS = ("principal", "tool", "decision", "rule", "event")
# How long an idle SSE stream waits before a keep-alive comment (proxies close silent connections).
KEEPALIVE_S = 15.0

Handler = Callable[[Request], Awaitable[Response]]


class Console:
    def __init__(self, cfg: AdminConfig, src: AdminSources, tap: AuditTap, *,
                 clock: Callable[[], float] = time.time, guard: Callable[[ASGIApp], ASGIApp] | None = None) -> None:
        self.cfg = cfg
        self._guard = guard
        self.src = src
        self.tap = tap
        self._clock = clock
        self._signer = Signer(cfg.secret.encode() if cfg.secret else secrets.token_bytes(32))
        self.revocations = Revocations(src.redis, clock=clock)
        self._env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                       autoescape=True, undefined=jinja2.StrictUndefined)
        # A stream ends when the console stops, so a graceful shutdown does not wait on open browsers.
        self.closing = asyncio.Event()

    # -- plumbing ---------------------------------------------------------------------------------------------

    def app(self) -> Starlette:
        routes = [
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self._post(self.logout), methods=["POST"]),
            Route("/", self._page(self.overview), methods=["GET"]),
            Route("/partials/upstreams", self._page(self.upstreams_partial), methods=["GET"]),
            Route("/catalogue", self._page(self.catalogue), methods=["GET"]),
            Route("/live", self._page(self.live), methods=["GET"]),
            Route("/live/stream", self._page(self.stream), methods=["GET"]),
            Route("/pins", self._page(self.pins), methods=["GET"]),
            Route("/pins/{action:str}", self._post(self.pin_action), methods=["POST"]),
            Route("/approvals", self._page(self.approvals), methods=["GET"]),
            Route("/partials/approvals", self._page(self.approvals_partial), methods=["GET"]),
            Route("/approvals/stream", self._page(self.approvals_stream), methods=["GET"]),
            Route("/approvals/{action:str}", self._post(self.approval_action), methods=["POST"]),
            Route("/policy", self._page(self.policy), methods=["GET"]),
            Route("/policy/explain", self._post(self.explain), methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        app = Starlette(routes=routes)
        guarded: ASGIApp = self._guard(app) if self._guard is not None else app

        async def headers(scope: Any, receive: Any, send: Any) -> None:
            async def send_with_headers(message: Any) -> None:
                if message["type"] == "http.response.start":
                    raw = [(k, v) for k, v in message.get("headers", []) if k.decode().lower() not in SECURITY_HEADERS]
                    raw += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                    message = {**message, "headers": raw}
                await send(message)

            await guarded(scope, receive, send_with_headers if scope["type"] == "http" else send)

        self._asgi = headers
        return app

    def asgi(self) -> Any:
        """The ASGI callable to serve: the app wrapped in the security headers."""
        self.app()
        return self._asgi

    def _render(self, name: str, request: Request, session: AdminSession | None, status: int = 200,
                **context: Any) -> HTMLResponse:
        body = self._env.get_template(name).render(session=session, path=request.url.path, **context)
        return HTMLResponse(body, status_code=status)

    async def session_of(self, request: Request) -> AdminSession | None:
        """The request's session: signed, unexpired and not revoked (logged out), or None."""
        if not self._client_allowed(request):
            return None
        session = self._signer.session(request.cookies.get(COOKIE), now=self._clock())
        if session is None or not self._key_in_force(session) or await self.revocations.revoked(session):
            return None
        return session

    async def _still_valid(self, session: AdminSession) -> bool:
        """What ``session_of`` asks, again, for a response that outlives its request (a stream)."""
        return session.expires > self._clock() and self._key_in_force(session) \
            and not await self.revocations.revoked(session)

    def _key_in_force(self, session: AdminSession) -> bool:
        """A session opened with an API key lasts while that key is in the key table in force (a reload of the
        key file may have removed it, or replaced it under the same id) and still makes its holder an admin (its
        groups may have changed). The table is asked, not the authenticator: the cookie holds no key. A gateway
        with no key table at all (API keys dropped from the config) holds no key such a session could stand on:
        with ``admin.secret`` set, its cookie outlives the restart that dropped them."""
        if session.auth_method != "api_key":
            return True
        if self.src.keys is None:
            return False
        entry = self.src.keys.table.by_id(session.admin)
        if entry is None or session.key is None or \
                not hmac.compare_digest(self._signer.bind(entry.hash).encode(), session.key.encode()):
            return False
        return entry.id in self.cfg.principals or bool(entry.groups & set(self.cfg.groups))

    def _client_allowed(self, request: Request) -> bool:
        # Without gateway auth the console has no credentials to check: only this machine may use it.
        if self.src.auth_enabled:
            return True
        return request.client is not None and is_loopback(request.client.host)

    def _page(self, handler: Callable[[Request, AdminSession], Awaitable[Response]]) -> Handler:
        async def run(request: Request) -> Response:
            session = await self.session_of(request)
            if session is None:
                if request.headers.get("accept", "").startswith("text/event-stream") or \
                        request.url.path.startswith("/partials"):
                    return Response("login required", status_code=401, media_type="text/plain")
                return RedirectResponse("/login", status_code=303)
            return await handler(request, session)

        return run

    def _post(self, handler: Callable[[Request, AdminSession, dict[str, str]], Awaitable[Response]]) -> Handler:
        async def run(request: Request) -> Response:
            session = await self.session_of(request)
            if session is None:
                return Response("login required", status_code=401, media_type="text/plain")
            form = await _form(request)
            if not csrf_ok(session, form.get("csrf")):
                await self._audit(session, request, "csrf", None, "refused", "missing or wrong CSRF token")
                return Response("CSRF token missing or wrong: reload the page and try again", status_code=403,
                                media_type="text/plain")
            return await handler(request, session, form)

        return run

    async def _audit(self, session: AdminSession | Principal | None, request: Request, action: str,
                     target: str | None, outcome: str, detail: str | None = None) -> None:
        admin = _principal(session) if isinstance(session, AdminSession) else session
        if action == "csrf":
            # A refused form is recorded as the action it tried to be.
            action = {"/pins/approve": "pin.approve", "/pins/reject": "pin.reject", "/logout": "logout",
                      "/policy/explain": "policy.explain", "/approvals/approve": "approval.approve",
                      "/approvals/deny": "approval.deny"}.get(request.url.path, "login")
        try:
            await self.src.audit_log.emit(admin_action_record(
                at=self._clock(), admin=admin, action=action, target=target, outcome=outcome, detail=detail,
                remote_addr=request.client.host if request.client else None))
        except Exception as exc:  # a required audit that fails is reported by the caller's outcome
            log.error("admin.audit_failed", detail=str(exc))
            raise

    # -- login ------------------------------------------------------------------------------------------------

    async def login_form(self, request: Request, error: str | None = None, status: int = 200) -> Response:
        if not self._client_allowed(request):
            return Response("the console accepts only loopback clients without 'auth'", status_code=403)
        nonce, token = self._signer.login_token()
        response = self._render("login.html", request, None, status=status, token=token, error=error,
                                need_key=self.src.auth_enabled)
        self._set_cookie(response, LOGIN_COOKIE, nonce, max_age=600)
        return response

    async def login(self, request: Request) -> Response:
        if not self._client_allowed(request):
            return Response("the console accepts only loopback clients without 'auth'", status_code=403)
        form = await _form(request)
        if not self._signer.login_ok(request.cookies.get(LOGIN_COOKIE), form.get("csrf")):
            await self._audit(None, request, "login_failed", None, "refused", "missing or wrong CSRF token")
            return Response("CSRF token missing or wrong: reload the login page", status_code=403,
                            media_type="text/plain")
        principal, problem = await self._admin_principal(form.get("key", ""))
        if principal is None:
            await self._audit(None, request, "login_failed", None, "refused", problem)
            return await self.login_form(request, error="not an admin credential", status=401)
        key = self._signer.bind(hash_key(form.get("key", "").strip())) if principal.auth_method == "api_key" else None
        cookie, _ = self._signer.issue(principal.id, tuple(sorted(principal.groups)), principal.auth_method,
                                       now=self._clock(), ttl_s=self.cfg.session_ttl_s, key=key)
        await self._audit(principal, request, "login", principal.id, "ok")
        response = RedirectResponse("/", status_code=303)
        self._set_cookie(response, COOKIE, cookie, max_age=int(self.cfg.session_ttl_s))
        response.delete_cookie(LOGIN_COOKIE, path="/")
        return response

    async def _admin_principal(self, key: str) -> tuple[Principal | None, str]:
        if not self.src.auth_enabled:
            # Loopback-only (checked above and at config load): the admin is whoever sits at this machine.
            return Principal(id="loopback-admin", auth_method="none"), ""
        key = key.strip()
        if not key:
            return None, "no credential"
        try:
            principal = await self.src.authenticator.authenticate({"authorization": f"Bearer {key}"})
        except AuthenticationError as exc:
            return None, f"authentication failed: {exc.log_detail}"
        if principal.auth_method == "none" or principal.id == Principal.anonymous().id:
            return None, "the anonymous principal is never an admin"
        if principal.id in self.cfg.principals or principal.groups & set(self.cfg.groups):
            return principal, ""
        return None, f"principal {principal.id!r} is in none of admin.groups and not in admin.principals"

    def _set_cookie(self, response: Response, name: str, value: str, *, max_age: int) -> None:
        response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="strict",
                            secure=not self.cfg.loopback)

    async def logout(self, request: Request, session: AdminSession, form: dict[str, str]) -> Response:
        # Revoked server-side (the cookie is signed: forgetting it in the browser alone revokes nothing), which
        # also ends this session's open streams.
        shared = await self.revocations.revoke(session)
        if shared:
            detail = "session revoked on every replica (Redis)"
        elif self.revocations.shared:
            detail = "session revoked on this replica only: Redis unavailable"
        elif self.cfg.secret is None:
            detail = "session revoked (its signing key is this replica's own)"
        else:
            detail = "session revoked on this replica (no Redis: replicas sharing admin.secret are not told)"
        await self._audit(session, request, "logout", session.admin, "ok", detail)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- pages ------------------------------------------------------------------------------------------------

    async def overview(self, request: Request, session: AdminSession) -> Response:
        return self._render("overview.html", request, session, o=pages.overview(self.src, self.tap))

    async def upstreams_partial(self, request: Request, session: AdminSession) -> Response:
        return self._render("_upstreams.html", request, session, o=pages.overview(self.src, self.tap))

    async def catalogue(self, request: Request, session: AdminSession) -> Response:
        chosen = request.query_params.get("principal") or None
        return self._render("catalogue.html", request, session, c=pages.catalogue(self.src, chosen))

    async def live(self, request: Request, session: AdminSession) -> Response:
        filters = {k: request.query_params.get(k, "") for k in FILTERS}
        return self._render("live.html", request, session, filters=filters,
                            log_arguments=self.src.audit_log.log_arguments)

    async def stream(self, request: Request, session: AdminSession) -> Response:
        filters = {k: request.query_params.get(k, "") for k in FILTERS}
        try:
            after = int(request.headers.get("last-event-id") or request.query_params.get("after") or 0)
        except ValueError:
            after = 0
        # A fresh stream starts with what the buffer holds (the last minutes), then follows.
        log_arguments = self.src.audit_log.log_arguments

        async def events() -> AsyncIterator[bytes]:
            seq = after
            # Ends the stream the moment the session expires or is logged out on this replica.
            ended = asyncio.ensure_future(self.revocations.wait_ended(session))
            closing = asyncio.ensure_future(self.closing.wait())
            batch: asyncio.Future[list[tuple[int, dict[str, Any]]]] | None = None
            try:
                yield b"retry: 1000\n\n"
                while True:
                    batch = asyncio.ensure_future(self.tap.wait(seq, KEEPALIVE_S))
                    waiters: set[asyncio.Future[Any]] = {batch, ended, closing}
                    done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                    if ended in done or closing in done:
                        return
                    records = batch.result()
                    # Asked again before anything is sent, and at each keep-alive tick: a logout through another
                    # replica (Redis) ends the stream here.
                    if not await self._still_valid(session):
                        return
                    if not records:
                        if await request.is_disconnected():
                            return
                        yield b": keep-alive\n\n"
                        continue
                    for s, record in records:
                        seq = s
                        if pages.matches(record, filters):
                            data = json.dumps(pages.live_record(record, log_arguments=log_arguments),
                                              ensure_ascii=False, separators=(",", ":"))
                            yield f"id: {s}\ndata: {data}\n\n".encode()
            finally:
                await cancel_and_wait([f for f in (batch, ended, closing) if f is not None])

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"x-accel-buffering": "no"})

    async def pins(self, request: Request, session: AdminSession, message: str | None = None,
                   status: int = 200) -> Response:
        error = None
        items: list[dict[str, Any]] = []
        if self.src.pinning is None:
            error = "pinning is not enabled (pinning.enabled: false)"
        else:
            try:
                items = pages.pins(await self.src.pinning.list(status="quarantined"))
            except PinStoreUnavailable as exc:
                error = f"pin store unavailable: {exc}"
        return self._render("pins.html", request, session, status=status, items=items, error=error,
                            message=message)

    async def pin_action(self, request: Request, session: AdminSession, form: dict[str, str]) -> Response:
        action = request.path_params["action"]
        if action not in ("approve", "reject") or self.src.pinning is None:
            return Response("no such action", status_code=404, media_type="text/plain")
        upstream, tool, fingerprint = form.get("upstream", ""), form.get("tool", ""), form.get("fingerprint") or None
        target = f"{upstream}/{tool}"
        # The same operation as `bastion pins approve|reject`, with the reviewed fingerprint: a definition that
        # changed again since the page was rendered is refused, never approved unseen.
        try:
            if action == "approve":
                event = await self.src.pinning.approve(upstream, tool, session.admin, fingerprint=fingerprint)
            else:
                event = await self.src.pinning.reject(upstream, tool, session.admin, fingerprint=fingerprint)
        except PinningError as exc:
            await self._audit(session, request, f"pin.{action}", target, "failed", str(exc))
            return await self.pins(request, session, message=f"{action} failed: {exc}", status=409)
        if action == "approve":
            await self.src.audit_log.emit(pin_approve_record(at=self._clock(), upstream=upstream, tool=tool,
                                                             fingerprint=event.new_fingerprint,
                                                             approved_by=session.admin))
        await self._audit(session, request, f"pin.{action}", target, "ok", f"fingerprint {event.new_fingerprint}")
        # This replica applies the decision now (others hear the store's announcement).
        self.src.pool.republish_soon()
        return RedirectResponse("/pins", status_code=303)

    # -- approvals --------------------------------------------------------------------------------------------

    def _may_decide(self, session: AdminSession) -> bool:
        """The admin API's rule: a principal in ``approvals.admin_groups``. Without gateway auth the console is
        loopback-only and its admin is whoever sits at this machine, as for pins."""
        service = self.src.approvals
        if service is None:
            return False
        return not self.src.auth_enabled or bool(set(session.groups) & set(service.config.admin_groups))

    async def _approvals_context(self, session: AdminSession) -> dict[str, Any]:
        service = self.src.approvals
        context: dict[str, Any] = {"enabled": service is not None, "pending": [], "error": None,
                                   "may_decide": self._may_decide(session),
                                   "log_arguments": self.src.audit_log.log_arguments,
                                   "admin_groups": list(service.config.admin_groups) if service else []}
        if service is not None:
            try:
                context["pending"] = pages.approvals(await service.list(), log_arguments=context["log_arguments"],
                                                   now=self._clock())
            except (RedisError, OSError) as exc:
                context["error"] = f"the approvals store (Redis) is unavailable: {type(exc).__name__}"
        return context

    async def approvals(self, request: Request, session: AdminSession, message: str | None = None,
                        status: int = 200) -> Response:
        return self._render("approvals.html", request, session, status=status, message=message,
                            a=await self._approvals_context(session))

    async def approvals_partial(self, request: Request, session: AdminSession) -> Response:
        return self._render("_approvals.html", request, session, a=await self._approvals_context(session))

    async def approvals_stream(self, request: Request, session: AdminSession) -> Response:
        """One event per approval opened or decided (on any replica, with Redis): its kind and id only, never its
        arguments; the page then re-fetches its table, rendered by the server by the page's rules."""
        service = self.src.approvals
        if service is None:
            return Response("approvals are not available", status_code=404, media_type="text/plain")

        async def events() -> AsyncIterator[bytes]:
            feed = service.subscribe()
            following: asyncio.Future[ApprovalEvent] = asyncio.ensure_future(anext(feed))
            closing = asyncio.ensure_future(self.closing.wait())
            # Ends the stream the moment the session expires or is logged out on this replica.
            ended = asyncio.ensure_future(self.revocations.wait_ended(session))
            try:
                # Let the subscription register first: whatever happens after the "sync" the page reacts to (a
                # fresh table) is then an event on this stream, so nothing falls between page load and stream.
                await asyncio.sleep(0)
                yield b'retry: 1000\n\ndata: {"kind":"sync"}\n\n'
                while True:
                    waiters: set[asyncio.Future[Any]] = {following, closing, ended}
                    done, _ = await asyncio.wait(waiters, timeout=KEEPALIVE_S,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if closing in done or ended in done:
                        return
                    # Asked again before anything is sent, and at each keep-alive tick: a logout through another
                    # replica (Redis) ends the stream here.
                    if not await self._still_valid(session):
                        return
                    if following in done:
                        event = following.result()
                        following = asyncio.ensure_future(anext(feed))
                        data = {"kind": event.kind, "id": event.approval_id,
                                "outcome": event.verdict.outcome if event.verdict is not None else None}
                        yield f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
                        continue
                    if await request.is_disconnected():
                        return
                    yield b": keep-alive\n\n"
            finally:
                await cancel_and_wait([following, closing, ended])
                if isinstance(feed, AsyncGenerator):
                    await feed.aclose()  # a cancelled step that had not started leaves it suspended

        return StreamingResponse(events(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    async def approval_action(self, request: Request, session: AdminSession, form: dict[str, str]) -> Response:
        action = request.path_params["action"]
        service = self.src.approvals
        if action not in ("approve", "deny") or service is None:
            return Response("no such action", status_code=404, media_type="text/plain")
        approval_id = form.get("id", "")
        audited = f"approval.{action}"
        if not self._may_decide(session):
            groups = ", ".join(service.config.admin_groups)
            detail = f"{session.admin!r} is in none of approvals.admin_groups ({groups})"
            await self._audit(session, request, audited, approval_id or None, "refused", detail)
            return await self.approvals(request, session, message=f"{action} refused: {detail}", status=403)
        try:
            pending = await service.get(approval_id) if approval_id else None
            # The same operation as `bastion approvals approve|deny` and the admin API: the first verdict wins.
            verdict = await service.decide(approval_id, action == "approve", by=session.admin, channel="console") \
                if approval_id else None
        except NotAnApprover as exc:
            await self._audit(session, request, audited, approval_id, "refused", str(exc))
            return await self.approvals(request, session, message=f"{action} refused: {exc}", status=403)
        except (RedisError, OSError) as exc:
            detail = f"the approvals store (Redis) is unavailable: {type(exc).__name__}"
            await self._audit(session, request, audited, approval_id or None, "failed", detail)
            return await self.approvals(request, session, message=f"{action} failed: {detail}", status=503)
        if verdict is None:
            detail = "not pending (already decided, timed out or withdrawn)"
            await self._audit(session, request, audited, approval_id or None, "failed", detail)
            return await self.approvals(request, session, message=f"{action} failed: {detail}", status=409)
        # The record the admin API writes for a decision, with the admin as decider; then the console's own.
        await self.src.audit_log.emit(approval_record(
            "approval.decided", at=self._clock(), decider=_principal(session), approval_id=approval_id,
            principal=pending.principal if pending else None, tool=pending.tool if pending else None,
            upstream=pending.upstream if pending else None, rule_id=pending.rule_id if pending else None,
            outcome=verdict.outcome, channel=verdict.channel, by=verdict.by))
        what = f"{pending.principal}: {pending.tool} (rule {pending.rule_id})" if pending else approval_id
        await self._audit(session, request, audited, approval_id, "ok", f"{verdict.outcome} {what}")
        return RedirectResponse("/approvals", status_code=303)

    def _policy_context(self) -> dict[str, Any]:
        holder, watcher = self.src.policy, self.src.policy_watcher
        if holder is None:
            return {"enabled": False}
        current = holder.current
        return {"enabled": True, "version": current.version, "files": list(current.files),
                "rules": len(current.rules), "status": watcher.status if watcher is not None else None}

    async def policy(self, request: Request, session: AdminSession) -> Response:
        return self._render("policy.html", request, session, p=self._policy_context(), result=None, who=None,
                            form={"principal": "", "groups": "", "claims": "{}", "tool": "", "arguments": "{}"},
                            error=None)

    async def explain(self, request: Request, session: AdminSession, form: dict[str, str]) -> Response:
        fields = {k: form.get(k, "") for k in ("principal", "groups", "claims", "tool", "arguments")}
        holder = self.src.policy
        result, error, who = None, None, None
        if holder is None:
            error = "no policy is configured: every authenticated principal may call every tool"
        else:
            try:
                claims = _json_object(fields["claims"], "claims")
                arguments = _json_object(fields["arguments"], "arguments")
                # The principal as the gateway would authenticate it (an API key's own groups and attributes; a
                # JWT subject from the claims entered), the same resolution as the catalogue and the CLI's.
                resolved = self.src.directory().resolve(
                    fields["principal"].strip(), groups=(g.strip() for g in fields["groups"].split(",")),
                    claims=claims)
                who = _who(resolved)
                # The tool as the catalogue has it (its real annotations), else a bare one by name, of the
                # upstream the configured prefixes give it (a rule's ``upstreams`` must meet the gateway's).
                entry = self.src.view().catalogue.tool(fields["tool"]) or \
                    tool_entry(fields["tool"], _upstream_by_name(self.src.naming, fields["tool"]), {})
                decision = holder.current.decide(resolved.principal, entry, arguments)
                result = decision_json(decision, holder.current)
            except ValueError as exc:
                error = str(exc)
        principal_text = f"principal {fields['principal']!r}" + (f" ({who['source']})" if who else "")
        await self._audit(session, request, "policy.explain", fields["tool"] or None,
                          "failed" if error else "ok",
                          error or f"{principal_text}: {result['decision'] if result else ''}")
        return self._render("policy.html", request, session, status=400 if error else 200,
                            p=self._policy_context(), result=result, who=who, form=fields, error=error)


def _upstream_by_name(naming: Naming, tool: str) -> str:
    found = naming.upstreams_of_name(tool)
    if len(found) != 1:
        raise ValueError(f"tool {tool!r} is not in the catalogue now, and the configured prefixes "
                         + ("name no upstream of it" if not found else f"fit upstream {' or '.join(sorted(found))}"))
    return found[0]


def _json_object(text: str, name: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError as exc:
        raise ValueError(f"{name}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a JSON object")
    return value


def _who(resolved: ResolvedPrincipal) -> dict[str, Any]:
    """The explained principal as the page shows it: where it came from, its groups and attributes."""
    principal = resolved.principal
    return {"id": principal.id, "source": resolved.source, "detail": resolved.detail,
            "groups": sorted(principal.groups), "ignored": list(resolved.ignored),
            "attributes": json.dumps(dict(principal.attributes), sort_keys=True, ensure_ascii=False, default=str)}


def _principal(session: AdminSession) -> Principal:
    return Principal(id=session.admin, groups=frozenset(session.groups), auth_method=session.auth_method)


async def _form(request: Request) -> dict[str, str]:
    try:
        data = await request.form()
    except Exception:  # a body that is not a form is a form without fields
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)}
