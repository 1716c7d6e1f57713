"""The admin approvals API on the main listener (default path ``/admin/approvals``).

``GET  {path}``                  pending approvals (every replica's, with Redis)
``GET  {path}/{id}``             one pending approval
``POST {path}/{id}/approve``     approve it; ``POST {path}/{id}/deny`` decline it

Every request authenticates like an MCP request (API key or JWT) and the principal must be in one of
``approvals.admin_groups``: 401 without valid credentials, 403 for a principal outside those groups. A decision
answers 200 with the verdict, or 409 when the approval is no longer pending (decided, timed out or withdrawn).
An optional JSON body ``{"channel": "cli"}`` says which tool sent the decision (``admin_api`` by default).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion.approvals.config import ApprovalsConfig
from bastion.approvals.model import Channel
from bastion.approvals.service import ApprovalService, NotAnApprover
from bastion.audit.record import admin_action_record, approval_record
from bastion.errors import AuthenticationError
from bastion.principal import Principal

Authenticate = Callable[[Mapping[str, str], str | None], Awaitable[Principal]]
Emit = Callable[[dict[str, Any]], Awaitable[None]]
# Which admin tool sent a decision; anything else is recorded as the API itself.
_CLIENT_CHANNELS: dict[str, Channel] = {"cli": "cli", "console": "console", "admin_api": "admin_api"}
_MAX_BODY = 4096


def approval_routes(service: ApprovalService, config: ApprovalsConfig, authenticate: Authenticate,
                    emit: Emit) -> list[Route]:
    admin_groups = frozenset(config.admin_groups)

    async def refused(request: Request, who: Principal, action: str, target: str | None, outcome: str,
                      detail: str, status: int) -> Response:
        """A request an authenticated caller made and the API refused or could not carry out: answered, and
        recorded as the console records its own (``admin.action``), so no one probes the approvals unseen.
        Failed authentication is the authenticator's ``auth.failure`` record already."""
        await emit(admin_action_record(at=time.time(), admin=who, action=action, target=target, outcome=outcome,
                                       detail=detail, remote_addr=request.client.host if request.client else None))
        return JSONResponse({"error": detail}, status_code=status)

    async def admin(request: Request, action: str) -> Principal | Response:
        try:
            principal = await authenticate(request.headers, request.client.host if request.client else None)
        except AuthenticationError:
            return JSONResponse({"error": "unauthorized"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        if not principal.groups & admin_groups:
            return await refused(request, principal, action, request.path_params.get("id"), "refused",
                                 "forbidden: not in an approvals admin group", 403)
        return principal

    async def list_pending(request: Request) -> Response:
        who = await admin(request, "approval.list")
        if isinstance(who, Response):
            return who
        return JSONResponse({"approvals": [p.to_json() for p in await service.list()]})

    async def show(request: Request) -> Response:
        who = await admin(request, "approval.show")
        if isinstance(who, Response):
            return who
        pending = await service.get(request.path_params["id"])
        if pending is None:
            return JSONResponse({"error": "no such pending approval"}, status_code=404)
        return JSONResponse(pending.to_json())

    async def decide(request: Request) -> Response:
        action = "approval.approve" if request.path_params["action"] == "approve" else "approval.deny"
        who = await admin(request, action)
        if isinstance(who, Response):
            return who
        body = await request.body()
        channel: Channel = "admin_api"
        if body:
            try:
                data = orjson.loads(body[:_MAX_BODY]) if len(body) <= _MAX_BODY else None
            except orjson.JSONDecodeError:
                data = None
            if not isinstance(data, dict):
                return JSONResponse({"error": "body must be a JSON object (at most 4 KiB)"}, status_code=400)
            channel = _CLIENT_CHANNELS.get(str(data.get("channel")), "admin_api")
        approval_id = request.path_params["id"]
        approve = request.path_params["action"] == "approve"
        pending = await service.get(approval_id)
        try:
            verdict = await service.decide(approval_id, approve, by=who.id, channel=channel)
        except NotAnApprover as exc:
            return await refused(request, who, action, approval_id, "refused", str(exc), 403)
        if verdict is None:
            return await refused(request, who, action, approval_id, "failed",
                                 "not pending (already decided, timed out or withdrawn)", 409)
        await emit(approval_record(
            "approval.decided", at=time.time(), decider=who, approval_id=approval_id,
            principal=pending.principal if pending else None, tool=pending.tool if pending else None,
            upstream=pending.upstream if pending else None, rule_id=pending.rule_id if pending else None,
            outcome=verdict.outcome, channel=verdict.channel, by=verdict.by))
        return JSONResponse({"id": approval_id, **verdict.to_json()})

    base = config.path
    return [Route(base, _store_errors(list_pending), methods=["GET"]),
            Route(base + "/{id}", _store_errors(show), methods=["GET"]),
            Route(base + "/{id}/{action:str}", _store_errors(_only_actions(decide)), methods=["POST"])]


def _store_errors(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """An unreachable Redis is a 503 the CLI can report, not a bare 500."""
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except (RedisError, OSError):
            return JSONResponse({"error": "the approvals store (Redis) is unavailable"}, status_code=503,
                                headers={"Retry-After": "1"})

    return route


def _only_actions(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        if request.path_params["action"] not in ("approve", "deny"):
            return JSONResponse({"error": "use .../approve or .../deny"}, status_code=404)
        return await handler(request)

    return route
