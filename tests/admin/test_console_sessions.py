"""Console sessions end everywhere they are used: a logout revokes the session server-side (pages, forms, streams;
with Redis on every replica), and a live stream ends when its session expires or is revoked. The real gateway
in-process and the console's real listener for the streams (the ASGI transport buffers whole bodies)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion.admin.revocation import Revocations
from bastion.admin.session import COOKIE, Signer
from tests.admin.test_console import alice_session, console, csrf_of, login
from tests.support.inprocess import FrontDoor
from tests.support.redis_server import RedisServer

STREAMS = ("/live/stream", "/approvals/stream")
# Bounded waits only: a stream that is still open after this never ends by itself (its keep-alive tick is 15 s).
ENDS_WITHIN_S = 10.0


def admin_port(door: FrontDoor) -> int:
    app = door.app
    port: int = app.state.bastion.admin.port
    return port


@contextlib.asynccontextmanager
async def open_stream(door: FrontDoor, path: str, cookie: str) -> AsyncIterator[AsyncIterator[str]]:
    """The stream's lines over the console's real listener, once it is established and has sent what it sends
    on opening (the live stream starts after the records already written; the approvals stream's ``sync``)."""
    app = door.app
    after = app.state.bastion.admin.console.tap.last
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin_port(door)}", cookies={COOKIE: cookie},
                                 timeout=30) as tcp, \
            tcp.stream("GET", path, params={"after": after}, headers={"accept": "text/event-stream"}) as r:
        assert r.status_code == 200
        lines = r.aiter_lines()
        opened = "data:" if path == "/approvals/stream" else "retry:"
        async with asyncio.timeout(ENDS_WITHIN_S):
            while not (await anext(lines)).startswith(opened):
                pass
        yield lines


async def rest_of(lines: AsyncIterator[str], within: float = ENDS_WITHIN_S) -> list[str]:
    """Every line the stream still sends, once it ended (a stream that does not end fails the wait)."""
    async with asyncio.timeout(within):
        return [line async for line in lines]


async def logout(browser: httpx.AsyncClient) -> httpx.Response:
    page = await browser.get("/policy")
    return await browser.post("/logout", data={"csrf": csrf_of(page.text)})


async def test_logout_revokes_the_cookie_for_pages_forms_and_streams(tmp_path: Path) -> None:
    async with console(tmp_path) as (door, browser):
        await login(browser)
        cookie = browser.cookies[COOKIE]
        token = csrf_of((await browser.get("/policy")).text)
        r = await logout(browser)
        assert r.status_code == 303 and r.headers["location"] == "/login"
        # The same cookie, presented again (a copy, another tab, a proxy's log), is no session any more.
        browser.cookies.set(COOKIE, cookie)
        for path in ("/", "/policy", "/catalogue", "/live", "/pins", "/approvals"):
            r = await browser.get(path)
            assert (r.status_code, r.headers.get("location")) == (303, "/login"), path
        assert (await browser.get("/partials/upstreams")).status_code == 401
        for stream in STREAMS:
            assert (await browser.get(stream, headers={"accept": "text/event-stream"})).status_code == 401
        form = {"csrf": token, "principal": "alice", "groups": "eng", "tool": "basic__echo", "arguments": "{}"}
        assert (await browser.post("/policy/explain", data=form)).status_code == 401
        assert (await browser.post("/logout", data={"csrf": token})).status_code == 401
        record = [r for r in door.records("admin.action") if r["action"] == "logout"][-1]
        assert record["outcome"] == "ok" and "revoked" in record["detail"]
        # A new login is a new session, unaffected by the old one's revocation.
        browser.cookies.clear()
        await login(browser)
        assert (await browser.get("/policy")).status_code == 200


@pytest.mark.parametrize("path", STREAMS)
async def test_an_open_stream_ends_at_logout_and_sends_nothing_after(tmp_path: Path, path: str) -> None:
    async with console(tmp_path) as (door, browser):
        await login(browser)
        async with open_stream(door, path, browser.cookies[COOKIE]) as stream:
            await logout(browser)
            # Other principals' activity after the logout: audit records the live stream used to deliver.
            await alice_session(door)
            rest = await rest_of(stream)
        assert [line for line in rest if line.startswith("data:")] == []


@pytest.mark.parametrize("path", STREAMS)
async def test_an_open_stream_ends_when_its_session_expires(tmp_path: Path, path: str) -> None:
    async with console(tmp_path, admin={"port": 0, "session_ttl_s": 3}) as (door, browser):
        await login(browser)
        async with open_stream(door, path, browser.cookies[COOKIE]) as stream:
            rest = await rest_of(stream, within=3 + ENDS_WITHIN_S)
            # Ended by the expiry, not by a logout or a shutdown: the cookie is refused the same way now.
            assert (await browser.get("/policy")).status_code == 303
            assert not [r for r in door.records("admin.action") if r["action"] == "logout"]
        assert [line for line in rest if line.startswith("data:")] == []


async def test_with_redis_a_logout_revokes_the_session_on_every_replica(tmp_path: Path,
                                                                        redis_server: RedisServer) -> None:
    shared: dict[str, Any] = {"redis": {"url": redis_server.url}, "admin": {"port": 0, "secret": "s" * 40}}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with console(tmp_path / "a", **shared) as (_, on_a), console(tmp_path / "b", **shared) as (door_b, on_b):
        await login(on_a)
        cookie = on_a.cookies[COOKIE]
        on_b.cookies.set(COOKIE, cookie)
        assert (await on_b.get("/policy")).status_code == 200  # one admin.secret: the cookie works on both
        async with open_stream(door_b, "/live/stream", cookie) as stream:
            r = await logout(on_a)
            assert r.status_code == 303
            assert (await on_b.get("/policy")).status_code == 303
            # Replica B's open stream is not woken by A's logout; it asks again before it sends anything.
            await alice_session(door_b)
            rest = await rest_of(stream)
        assert [line for line in rest if line.startswith("data:")] == []


async def test_revocations_are_kept_until_the_session_expires_and_no_longer() -> None:
    now = [1000.0]
    signer = Signer(b"k" * 32)
    revocations = Revocations(clock=lambda: now[0])
    _, first = signer.issue("root", ("admin",), "api_key", now=now[0], ttl_s=60)
    _, second = signer.issue("root", ("admin",), "api_key", now=now[0], ttl_s=600)
    assert not await revocations.revoked(first)
    assert await revocations.revoke(first) is False  # no Redis: this replica only
    assert await revocations.revoked(first) and not await revocations.revoked(second)
    now[0] += 61  # past the first session's own expiry: its cookie is refused by its signature's expiry anyway
    await revocations.revoke(second)
    assert len(revocations) == 1 and await revocations.revoked(second)


async def test_while_redis_is_down_a_logout_holds_on_its_replica_and_says_so(tmp_path: Path,
                                                                             private_redis: RedisServer) -> None:
    shared: dict[str, Any] = {"redis": {"url": private_redis.url}, "admin": {"port": 0, "secret": "s" * 40}}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with console(tmp_path / "a", **shared) as (door_a, on_a), console(tmp_path / "b", **shared) as (_, on_b):
        await login(on_a)
        on_b.cookies.set(COOKIE, on_a.cookies[COOKIE])
        page = (await on_a.get("/policy")).text
        private_redis.kill()
        assert (await on_a.post("/logout", data={"csrf": csrf_of(page)})).status_code == 303
        record = [r for r in door_a.records("admin.action") if r["action"] == "logout"][-1]
        assert record["detail"] == "session revoked on this replica only: Redis unavailable"
        on_a.cookies.set(COOKIE, on_b.cookies[COOKIE])
        assert (await on_a.get("/policy")).status_code == 303  # this replica's own revocation holds
        # The documented limit: another replica cannot be told, and an admin is not locked out by the outage.
        assert (await on_b.get("/policy")).status_code == 200


async def test_a_replica_that_saw_a_revocation_keeps_it_when_redis_loses_it(tmp_path: Path,
                                                                            private_redis: RedisServer) -> None:
    # Replica B learnt of A's logout from Redis on every request, and only there: Redis restarted without
    # persistence (or down) gave the logged-out cookie its session back on B until the cookie's own expiry.
    shared: dict[str, Any] = {"redis": {"url": private_redis.url}, "admin": {"port": 0, "secret": "s" * 40}}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with console(tmp_path / "a", **shared) as (_, on_a), console(tmp_path / "b", **shared) as (_, on_b):
        await login(on_a)
        on_b.cookies.set(COOKIE, on_a.cookies[COOKIE])
        assert (await on_b.get("/policy")).status_code == 200
        assert (await logout(on_a)).status_code == 303
        assert (await on_b.get("/policy")).status_code == 303  # B reads the revocation from Redis
        private_redis.kill()
        assert (await on_b.get("/policy")).status_code == 303  # Redis down: B still knows
        private_redis.start()  # back, empty
        assert (await on_b.get("/policy")).status_code == 303
