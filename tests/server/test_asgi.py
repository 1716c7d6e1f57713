"""``GatewayApp`` serves the MCP endpoint ahead of starlette's stack and answers everything exactly as plain
starlette with the same routes does."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bastion.server.asgi import GatewayApp


class Endpoint:
    """An ASGI endpoint that says what reached it, and whether starlette's router had seen the request."""

    def __init__(self) -> None:
        self.routed: list[bool] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.routed.append("router" in scope)
        request = Request(scope, receive)
        body = await request.body()
        await JSONResponse({"method": scope["method"], "body": body.decode(), "app": "app" in scope})(
            scope, receive, send)


def _apps(endpoint: Endpoint, lifespan_events: list[str]) -> tuple[Starlette, Starlette]:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        lifespan_events.append("start")
        yield
        lifespan_events.append("stop")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def routes() -> list[Route]:
        return [Route("/mcp", endpoint, methods=["GET", "POST", "DELETE"]), Route("/healthz", healthz)]

    plain = Starlette(routes=routes(), lifespan=lifespan)
    fast = GatewayApp(routes=routes(), lifespan=lifespan, mcp_path="/mcp", mcp_endpoint=endpoint)
    return plain, fast


async def _call(app: Starlette, method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
        return await client.request(method, path, **kwargs)


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/mcp"), ("GET", "/mcp"), ("DELETE", "/mcp"), ("HEAD", "/mcp"), ("PUT", "/mcp"), ("PATCH", "/mcp"),
    ("POST", "/mcp/"), ("GET", "/healthz"), ("POST", "/healthz"), ("GET", "/nowhere"), ("GET", "/m%63p"),
])
async def test_every_answer_is_what_plain_starlette_gives(method: str, path: str) -> None:
    endpoint = Endpoint()
    plain, fast = _apps(endpoint, [])
    expected = await _call(plain, method, path, content=b"{}")
    got = await _call(fast, method, path, content=b"{}")
    assert (got.status_code, got.content) == (expected.status_code, expected.content)
    assert got.headers.multi_items() == expected.headers.multi_items()


async def test_the_mcp_endpoint_is_served_without_the_router() -> None:
    endpoint = Endpoint()
    plain, fast = _apps(endpoint, [])
    await _call(plain, "POST", "/mcp", content=b"{}")
    await _call(fast, "POST", "/mcp", content=b"{}")
    await _call(fast, "PUT", "/mcp", content=b"{}")  # not a method of the route: starlette answers, unrouted
    assert endpoint.routed == [True, False]


async def test_the_lifespan_still_runs_through_starlette() -> None:
    events: list[str] = []
    _, fast = _apps(Endpoint(), events)
    async with fast.router.lifespan_context(fast):
        assert events == ["start"]
    assert events == ["start", "stop"]
