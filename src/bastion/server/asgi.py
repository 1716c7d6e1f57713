"""The gateway's ASGI application: the MCP endpoint served straight, everything else through starlette.

Every MCP request used to pass starlette's error middleware, exception middleware, router and route before
reaching ``McpEndpoint``: four layers, two of them wrapping ``send`` again, around one endpoint that already
answers every error it knows itself. They cost about a tenth of the front door's CPU per call. ``GatewayApp``
is starlette's application with one layer in front of that stack: a request for the MCP path, with a method its
route accepts, goes to the endpoint directly. Everything else (the other routes, a method the route refuses,
``/mcp/``, the lifespan) takes starlette's usual path, so every answer stays what starlette gave.

What the skipped layers did for the MCP path is kept where it matters:

- the route's methods (``GET``, ``POST``, ``DELETE``, and ``HEAD`` that starlette adds for ``GET``) are the ones
  served straight, so any other method still gets starlette's 405;
- an error the endpoint does not know (a bug) is answered by the endpoint as starlette's error middleware answers
  it (``McpEndpoint.__call__``), then raised to the server, which logs it and closes the connection;
- ``scope["app"]`` is still the application (starlette sets it before any layer).

A deployment under a ``root_path`` (never set by ``bastion serve``) is left to starlette's router, which knows
how to strip it.

One check runs ahead of both: the listener's Host check (``HostGuard``, DNS-rebinding protection), once per
request, for every path and method, so that no route, 404 or redirect answers a name a loopback listener does not
answer to. A refusal is reported like every other refusal of the front door (``on_refused``: counted and
audited) and answered with the same JSON body the MCP endpoint gives its own refusals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from bastion.errors import Refused
from bastion.server.answer import http_error_response
from bastion.server.checks import FRONT_LINES, FrontLines, HostGuard

__all__ = ["GatewayApp", "Guarded", "McpFirst", "OnRefused", "refuse"]

# (refusal, remote address, method, path, traceparent): counts and audits a refusal (RefusalReporter.report).
OnRefused = Callable[[Refused, str | None, str | None, str | None, str | None], None]

# The methods starlette's Route serves for ["GET", "POST", "DELETE"] (it adds HEAD for GET).
ROUTE_METHODS = frozenset({"GET", "HEAD", "POST", "DELETE"})


async def refuse(exc: Refused, scope: Scope, receive: Receive, send: Send, on_refused: OnRefused | None) -> None:
    """Report a refusal made before routing and answer it as the MCP endpoint answers its own."""
    if on_refused is not None:
        client = scope.get("client")
        lines: FrontLines | None = scope.get(FRONT_LINES)
        trace = lines.first.get(b"traceparent") if lines is not None else None
        on_refused(exc, client[0] if client else None, scope.get("method"), scope.get("path"),
                   None if trace is None else trace.decode("latin-1"))
    await http_error_response(exc)(scope, receive, send)


class McpFirst:
    """An ASGI app: the MCP endpoint for its own path and methods, ``rest`` for everything else; with a ``guard``,
    every HTTP request passes the listener's Host check first (the endpoint does not check Host again)."""

    __slots__ = ("_endpoint", "_guard", "_on_refused", "_path", "_rest")

    def __init__(self, path: str, endpoint: ASGIApp, rest: ASGIApp, guard: HostGuard | None = None,
                 on_refused: OnRefused | None = None) -> None:
        self._path = path
        self._endpoint = endpoint
        self._rest = rest
        self._guard = guard
        self._on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if self._guard is not None:
                try:
                    self._guard(scope)
                except Refused as exc:
                    await refuse(exc, scope, receive, send, self._on_refused)
                    return
            if scope["path"] == self._path and scope["method"] in ROUTE_METHODS and not scope.get("root_path"):
                await self._endpoint(scope, receive, send)
                return
        await self._rest(scope, receive, send)


class Guarded:
    """An ASGI app behind the listener's Host check: the admin console's listener, by the same mechanism."""

    __slots__ = ("_app", "_guard", "_on_refused")

    def __init__(self, app: ASGIApp, guard: HostGuard, on_refused: OnRefused | None = None) -> None:
        self._app = app
        self._guard = guard
        self._on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                self._guard(scope)
            except Refused as exc:
                await refuse(exc, scope, receive, send, self._on_refused)
                return
        await self._app(scope, receive, send)


class GatewayApp(Starlette):
    """Starlette's application with the MCP endpoint served ahead of its middleware and router.

    The endpoint keeps its ``Route`` in ``routes`` too: that route answers what the shortcut leaves to starlette
    (other methods, a ``root_path``). ``host_guard``, when given, checks every HTTP request's Host before either.
    """

    def __init__(self, *, routes: Sequence[BaseRoute], lifespan: Any, mcp_path: str, mcp_endpoint: ASGIApp,
                 host_guard: HostGuard | None = None, on_refused: OnRefused | None = None) -> None:
        # Set before starlette's constructor, which may build the middleware stack.
        self._mcp_path = mcp_path
        self._mcp_endpoint = mcp_endpoint
        self._host_guard = host_guard
        self._on_refused = on_refused
        super().__init__(routes=routes, lifespan=lifespan)

    def build_middleware_stack(self) -> ASGIApp:
        return McpFirst(self._mcp_path, self._mcp_endpoint, super().build_middleware_stack(), self._host_guard,
                        self._on_refused)
