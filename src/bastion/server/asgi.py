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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["GatewayApp", "McpFirst"]

# The methods starlette's Route serves for ["GET", "POST", "DELETE"] (it adds HEAD for GET).
ROUTE_METHODS = frozenset({"GET", "HEAD", "POST", "DELETE"})


class McpFirst:
    """An ASGI app: the MCP endpoint for its own path and methods, ``rest`` for everything else."""

    __slots__ = ("_endpoint", "_path", "_rest")

    def __init__(self, path: str, endpoint: ASGIApp, rest: ASGIApp) -> None:
        self._path = path
        self._endpoint = endpoint
        self._rest = rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"] == self._path and scope["method"] in ROUTE_METHODS
                and not scope.get("root_path")):
            await self._endpoint(scope, receive, send)
            return
        await self._rest(scope, receive, send)


class GatewayApp(Starlette):
    """Starlette's application with the MCP endpoint served ahead of its middleware and router.

    The endpoint keeps its ``Route`` in ``routes`` too: that route answers what the shortcut leaves to starlette
    (other methods, a ``root_path``).
    """

    def __init__(self, *, routes: Sequence[BaseRoute], lifespan: Any, mcp_path: str, mcp_endpoint: ASGIApp) -> None:
        super().__init__(routes=routes, lifespan=lifespan)
        self._mcp_path = mcp_path
        self._mcp_endpoint = mcp_endpoint

    def build_middleware_stack(self) -> ASGIApp:
        return McpFirst(self._mcp_path, self._mcp_endpoint, super().build_middleware_stack())
