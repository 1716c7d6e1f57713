"""The listener's Host check (DNS-rebinding protection) covers every request on the listener, not only the MCP
path: every route of the app (derived from its routes, so a route added later is covered), unknown paths,
starlette's trailing-slash redirect, every method; and it judges an absolute-form target's authority instead of
``Host`` (RFC 9112 section 3.2.2). In process: the real app behind httpx's ASGI transport, or raw ASGI calls."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route

from bastion.errors import Refused
from bastion.server import checks
from bastion.server.checks import FRONT_LINES, HostGuard, front_lines, target_authority
from bastion.settings import ListenConfig
from tests.support.inprocess import FrontDoor, front_door

FOREIGN = "rebind.attacker.example"
LOOPBACK = ListenConfig(host="127.0.0.1", port=8080)


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[FrontDoor]:
    async with front_door(tmp_path) as fd:
        yield fd


def every_route(app: Any) -> list[tuple[str, str]]:
    """(method, path) for every method of every route the app has, path parameters filled in."""
    found = [(method, re.sub(r"\{[^}]*\}", "x", route.path))
             for route in app.routes if isinstance(route, Route) for method in sorted(route.methods or ())]
    assert {path for _, path in found} >= {"/mcp", "/healthz", "/readyz", "/metrics"}
    return found


def refusals(text: str) -> float:
    match = re.search(r'^bastion_http_refusals_total\{reason="host"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


async def test_every_route_every_method_and_any_path_refuses_a_foreign_host_with_the_mcp_answer(
        door: FrontDoor) -> None:
    mcp = await door.client.post("/mcp", content=b"{}", headers={"Host": FOREIGN, "Content-Type": "application/json"})
    assert mcp.status_code == 421
    assert mcp.json() == {"jsonrpc": "2.0", "id": None,
                          "error": {"code": -32600, "message": "Misdirected Request: Host not allowed"}}
    before = refusals((await door.client.get("/metrics")).text)
    requests = [*every_route(door.app), ("GET", "/nowhere"), ("POST", "/nowhere"), ("PUT", "/healthz"),
                ("POST", "/mcp/"), ("GET", "/mcp/"), ("OPTIONS", "/readyz"), ("GET", "/metrics/")]
    for method, path in requests:
        response = await door.client.request(method, path, content=b"{}",
                                             headers={"Host": f"{FOREIGN}:8080", "Content-Type": "application/json"})
        assert response.status_code == 421, (method, path, response.status_code, response.text[:200])
        assert "location" not in response.headers, (method, path)
        if method != "HEAD":
            assert response.content == mcp.content, (method, path)
            assert response.headers["content-type"] == "application/json"
    # Counted like the MCP path's refusals, one each.
    assert refusals((await door.client.get("/metrics")).text) - before == len(requests)
    deadline = asyncio.get_running_loop().time() + 5
    while asyncio.get_running_loop().time() < deadline and not any(
            r["path"] == "/readyz" for r in door.records("http.refused")):
        await asyncio.sleep(0.05)
    record = next(r for r in door.records("http.refused") if r["path"] == "/readyz")
    assert (record["status"], record["reason"], record["method"]) == (421, "host", "GET")
    assert record["detail"] == f"host={FOREIGN}:8080"


async def test_loopback_hosts_are_still_served_on_every_path(door: FrontDoor) -> None:
    for host in ("127.0.0.1:8080", "localhost", "[::1]:8080", "LOCALHOST.:8080"):
        ready = await door.client.get("/readyz", headers={"Host": host})
        assert ready.status_code == 200, (host, ready.text)
        assert ready.json()["status"] == "ready"
        health = await door.client.get("/healthz", headers={"Host": host})
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        assert (await door.client.get("/metrics", headers={"Host": host})).status_code == 200
        assert (await door.client.get("/nowhere", headers={"Host": host})).status_code == 404
    redirect = await door.client.post("/mcp/", content=b"{}", headers={"Host": "127.0.0.1:8080"})
    assert redirect.status_code == 307
    assert redirect.headers["location"] == "http://127.0.0.1:8080/mcp"


async def test_malformed_or_twice_sent_host_is_400_on_every_path(door: FrontDoor) -> None:
    bad = await door.client.get("/healthz", headers={"Host": "localhost:1.attacker.example"})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "Bad Request: invalid Host header"
    status, _ = await asgi_call(door.app, "GET", "/readyz", [(b"host", b"127.0.0.1"), (b"host", FOREIGN.encode())])
    assert status == 400


async def test_an_mcp_request_is_host_checked_once(door: FrontDoor, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str | None] = []
    judge = checks.check_host

    def counting(host: str | None, listen: ListenConfig, what: str = "Host header") -> None:
        calls.append(host)
        judge(host, listen, what)

    monkeypatch.setattr(checks, "check_host", counting)
    # A Host value never seen before, so the remembered acceptances cannot hide a second check.
    response = await door.post({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}},
                               {"Host": "localhost:4321"})
    assert response.status_code != 421
    assert calls == ["localhost:4321"]


# -- absolute-form request targets ------------------------------------------------------------------------------


async def asgi_call(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]],
                    target: bytes | None = None) -> tuple[int, dict[bytes, bytes]]:
    """One request straight into the ASGI app, with the ``FrontLines`` bastion's protocol would leave in the
    scope (the request target too, when it is not origin-form). Returns the status and the response headers."""
    lines = front_lines(headers)
    lines.target = target
    scope: dict[str, Any] = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                             "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000),
                             "server": ("127.0.0.1", 8080), FRONT_LINES: lines}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], dict(start.get("headers", []))


async def test_an_absolute_form_target_is_judged_by_its_authority_not_host(door: FrontDoor) -> None:
    loopback = [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json")]
    foreign = [(b"host", FOREIGN.encode()), (b"content-type", b"application/json")]
    for path in ("/mcp", "/readyz", "/healthz", "/metrics", "/nowhere", "/mcp/"):
        status, _ = await asgi_call(door.app, "POST" if path.startswith("/mcp") else "GET", path, loopback,
                                    f"http://{FOREIGN}{path}".encode())
        assert status == 421, path
    status, _ = await asgi_call(door.app, "GET", "/readyz", foreign, b"http://127.0.0.1:8080/readyz")
    assert status == 200
    # The target's authority replaces Host for what runs after the check: a redirect points at it.
    status, headers = await asgi_call(door.app, "POST", "/mcp/", foreign, b"http://127.0.0.1:8080/mcp/")
    assert (status, headers[b"location"]) == (307, b"http://127.0.0.1:8080/mcp")


@pytest.mark.parametrize(("target", "host", "refusal"), [
    (b"http://rebind.attacker.example/mcp", b"127.0.0.1", 421),
    (b"HTTPS://rebind.attacker.example:443/mcp?x=1", b"localhost", 421),
    (b"http://127.0.0.1.rebind.attacker.example/", b"127.0.0.1", 421),
    (b"http://127.0.0.1@rebind.attacker.example/mcp", b"127.0.0.1", 400),
    (b"http:///mcp", b"127.0.0.1", 400),
    (b"ftp://127.0.0.1/mcp", b"127.0.0.1", 400),
    (b"http://127.0.0.1/mcp", None, 400),
    (b"http://127.0.0.1:8080/mcp", b"rebind.attacker.example", None),
    (b"http://[::1]:8080?x", b"rebind.attacker.example", None),
    (b"http://localhost#f", b"x", None),
    (b"*", b"127.0.0.1", None),
    (b"*", FOREIGN.encode(), 421),
])
def test_host_guard_judges_the_target_authority(target: bytes, host: bytes | None, refusal: int | None) -> None:
    headers = [] if host is None else [(b"host", host)]
    scope: dict[str, Any] = {"headers": list(headers), FRONT_LINES: front_lines(headers)}
    scope[FRONT_LINES].target = target
    guard = HostGuard(LOOPBACK)
    if refusal is None:
        guard(scope)
        authority = target_authority(target)
        if authority is not None:
            assert scope["headers"] == [(b"host", authority.encode())]
            assert scope[FRONT_LINES].first[b"host"] == authority.encode()
        return
    with pytest.raises(Refused) as caught:
        guard(scope)
    assert (caught.value.status, caught.value.reason) == (refusal, "host")


def test_host_guard_on_a_public_listener_needs_a_well_formed_host_only() -> None:
    """What kubelet probes send (``Host: <pod IP>:<port>``) passes a listener on 0.0.0.0; nothing is cached
    beyond HostCheck's bound, and a missing Host is still 400."""
    guard = HostGuard(ListenConfig(host="0.0.0.0"))
    for host in (b"10.244.1.7:8080", b"[fd00:10:244::7]:8080", b"bastion.mcp.svc.cluster.local:8080", FOREIGN.encode()):
        guard({"headers": [(b"host", host)]})
    with pytest.raises(Refused) as caught:
        guard({"headers": []})
    assert caught.value.status == 400


def test_a_remembered_host_lets_neither_a_foreign_target_nor_a_second_host_through() -> None:
    guard = HostGuard(LOOPBACK, size=2)
    accepted = [(b"host", b"127.0.0.1")]
    guard({"headers": list(accepted)})  # now remembered
    guard({"headers": list(accepted)})
    absolute: dict[str, Any] = {"headers": list(accepted), FRONT_LINES: front_lines(accepted)}
    absolute[FRONT_LINES].target = b"http://rebind.attacker.example/mcp"
    with pytest.raises(Refused) as caught:
        guard(absolute)
    assert caught.value.status == 421
    with pytest.raises(Refused) as caught:
        guard({"headers": [*accepted, (b"host", FOREIGN.encode())]})
    assert (caught.value.status, caught.value.reason) == (400, "duplicate_header")
    for host in (b"localhost", b"[::1]", b"localhost:1", b"127.0.0.1:2"):  # more values than it remembers
        guard({"headers": [(b"host", host)]})
    assert len(guard._accepted) == 2
    with pytest.raises(Refused):
        guard({"headers": [(b"host", FOREIGN.encode())]})
