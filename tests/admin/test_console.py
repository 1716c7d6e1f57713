"""The console in-process: the real gateway (create_app, stdio fixture upstream, file audit sink) and the
console's ASGI app on the same event loop, reached through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

import bastion.audit
from bastion.admin.session import COOKIE
from bastion.auth.apikeys import hash_key
from tests.support.inprocess import FrontDoor, front_door

ADMIN_KEY = "bst_admin_key_for_tests_0123456789abcdef"
USER_KEY = "bst_user_key_for_tests_0123456789abcdef"
POLICY = """version: 1
rules:
  - id: eng-echo
    effect: allow
    principals: {groups: [eng]}
    tools: ["basic__echo"]
  - id: admins-all
    effect: allow
    principals: {groups: [admin]}
"""


@contextlib.asynccontextmanager
async def console(tmp_path: Path, policy_text: str = POLICY,
                  **config: Any) -> AsyncIterator[tuple[FrontDoor, httpx.AsyncClient]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    config.setdefault("auth", {"api_keys": [{"id": "root", "hash": hash_key(ADMIN_KEY), "groups": ["admin"]},
                                            {"id": "alice", "hash": hash_key(USER_KEY), "groups": ["eng"]}]})
    config.setdefault("policies", [str(policy)])
    config.setdefault("admin", {"port": 0})
    async with front_door(tmp_path, **config) as door:
        app = door.app
        admin = app.state.bastion.admin
        assert admin is not None
        transport = httpx.ASGITransport(app=admin.console.asgi(), client=("127.0.0.1", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=10) as browser:
            yield door, browser


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html
    return match.group(1)


async def login(browser: httpx.AsyncClient, key: str = ADMIN_KEY) -> httpx.Response:
    form = await browser.get("/login")
    return await browser.post("/login", data={"csrf": csrf_of(form.text), "key": key})


async def test_pages_need_a_session_and_carry_a_strict_csp(tmp_path: Path) -> None:
    async with console(tmp_path) as (_, browser):
        for path in ("/", "/catalogue", "/live", "/pins", "/approvals", "/policy"):
            r = await browser.get(path)
            assert r.status_code == 303
            assert r.headers["location"] == "/login"
        for stream in ("/live/stream", "/approvals/stream"):
            r = await browser.get(stream, headers={"accept": "text/event-stream"})
            assert r.status_code == 401
        assert (await browser.get("/partials/approvals")).status_code == 401
        r = await browser.get("/login")
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
        # No inline script anywhere: every <script> has a src on bastion itself.
        assert re.findall(r"<script(?![^>]*src=\"/static/)", r.text) == []


async def test_login_sets_a_strict_cookie_and_audits_the_admin(tmp_path: Path) -> None:
    async with console(tmp_path) as (door, browser):
        r = await login(browser)
        assert r.status_code == 303, r.text
        cookie = r.headers["set-cookie"]
        assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert "Secure" not in cookie  # loopback listener
        r = await browser.get("/")
        assert r.status_code == 200
        assert "basic" in r.text and 'id="admin-id">root<' in r.text
        records = door.records("admin.action")
        assert records[-1]["action"] == "login" and records[-1]["principal"]["id"] == "root"
        schema = json.loads((Path(bastion.audit.__file__).parent / "schema.json").read_text())
        for record in records:
            jsonschema.Draft202012Validator(schema).validate(record)
        assert records[-1]["outcome"] == "ok"


async def test_login_refuses_non_admins_wrong_keys_and_missing_csrf(tmp_path: Path) -> None:
    async with console(tmp_path) as (door, browser):
        assert (await login(browser, USER_KEY)).status_code == 401  # authenticated, but not in admin.groups
        assert (await login(browser, "bst_wrong")).status_code == 401
        assert (await login(browser, "")).status_code == 401
        await browser.get("/login")
        r = await browser.post("/login", data={"key": ADMIN_KEY})  # no token
        assert r.status_code == 403
        r = await browser.post("/login", data={"key": ADMIN_KEY, "csrf": "forged.token"})
        assert r.status_code == 403
        assert (await browser.get("/")).status_code == 303
        failed = [r for r in door.records("admin.action") if r["action"] == "login_failed"]
        assert len(failed) == 5
        assert all(r["outcome"] == "refused" and r["principal"] is None for r in failed)


async def test_forged_and_expired_cookies_are_no_session(tmp_path: Path) -> None:
    async with console(tmp_path) as (_, browser):
        await login(browser)
        good = browser.cookies[COOKIE]
        body, _, mac = good.partition(".")
        browser.cookies.set(COOKIE, body + "." + ("A" if mac[0] != "A" else "B") + mac[1:])
        assert (await browser.get("/")).status_code == 303


async def test_state_changes_need_the_session_csrf_token(tmp_path: Path) -> None:
    async with console(tmp_path) as (door, browser):
        await login(browser)
        page = await browser.get("/policy")
        token = csrf_of(page.text)
        form = {"principal": "alice", "groups": "eng", "tool": "basic__echo", "arguments": "{}"}
        assert (await browser.post("/policy/explain", data=form)).status_code == 403
        assert (await browser.post("/policy/explain", data={**form, "csrf": "x" + token})).status_code == 403
        assert (await browser.post("/logout", data={})).status_code == 403
        assert (await browser.post("/pins/approve", data={"upstream": "basic", "tool": "echo"})).status_code == 403
        assert (await browser.post("/approvals/deny", data={"id": "0" * 24})).status_code == 403
        refused = [r for r in door.records("admin.action") if r["outcome"] == "refused"]
        assert {r["action"] for r in refused} >= {"policy.explain", "logout", "pin.approve", "approval.deny"}
        r = await browser.post("/policy/explain", data={**form, "csrf": token})
        assert r.status_code == 200
        assert 'id="decision">allow<' in r.text and 'id="rule">eng-echo<' in r.text
        # alice is an API key: its entry's groups decide, not the form's (see test_console_explain.py).
        r = await browser.post("/policy/explain", data={**form, "principal": "bob", "groups": "", "csrf": token})
        assert 'id="decision">deny<' in r.text
        r = await browser.post("/policy/explain", data={**form, "arguments": "[1]", "csrf": token})
        assert r.status_code == 400
        explained = [r for r in door.records("admin.action") if r["action"] == "policy.explain"]
        assert [r["outcome"] for r in explained][-3:] == ["ok", "ok", "failed"]
        assert all(r["principal"]["id"] == "root" for r in explained if r["outcome"] != "refused")


async def test_pages_render_without_secrets(tmp_path: Path) -> None:
    async with console(tmp_path) as (_, browser):
        await login(browser)
        texts = [(await browser.get(p)).text for p in ("/", "/catalogue", "/live", "/pins", "/policy",
                                                        "/partials/upstreams", "/approvals", "/partials/approvals",
                                                        "/catalogue?principal=alice")]
        joined = "\n".join(texts)
        assert "basic__echo" in texts[1]
        assert "state-up" in texts[0]
        assert hash_key(ADMIN_KEY) not in joined and "sha256:" not in joined and ADMIN_KEY not in joined
        assert 'id="no-pins"' in texts[3]  # pinning is on by default, and nothing changed yet
        assert "policy.yaml" in texts[4]
        assert 'id="no-approvals"' in texts[6] and 'id="no-approvals"' in texts[7]
        assert all('href="/approvals"' in t for t in texts[:5])  # the nav links every page to it


async def test_live_stream_filters_and_hides_arguments(tmp_path: Path) -> None:
    async with console(tmp_path) as (door, browser):
        await login(browser)
        bad = {"Authorization": f"Bearer {USER_KEY}"}
        headers = dict(bad)
        sess = await door.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
            headers)
        headers = {**headers, "Mcp-Session-Id": sess.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        await door.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
        for tool in ("basic__echo", "basic__add"):
            await door.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                             "params": {"name": tool, "arguments": {"message": "secret-argument", "a": 1, "b": 2}}},
                            headers)
        # Over the console's real listener: the ASGI transport buffers whole bodies, and a stream never ends.
        app = door.app
        port = app.state.bastion.admin.port
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", cookies=browser.cookies,
                                     timeout=10) as tcp, \
                tcp.stream("GET", "/live/stream", params={"decision": "deny"},
                           headers={"accept": "text/event-stream"}) as r:
            assert r.status_code == 200
            events: list[dict[str, Any]] = []
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    break
        assert events[0]["event"] == "tool.call" and events[0]["decision"] == "deny"
        assert events[0]["tool"]["name"] == "basic__add"
        assert "secret-argument" not in json.dumps(events) and "arguments" not in events[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3"])
def test_non_loopback_console_needs_auth(host: str) -> None:
    from bastion.admin.config import AdminConfig
    from bastion.errors import ConfigError

    cfg = AdminConfig.from_mapping({"host": host}, "admin")
    with pytest.raises(ConfigError, match="not loopback"):
        cfg.check_auth(auth_enabled=False)
    cfg.check_auth(auth_enabled=True)
    AdminConfig.from_mapping({"host": "127.0.0.1"}, "admin").check_auth(auth_enabled=False)
    # At config load, so `bastion check` finds it as `serve` would.
    from bastion.settings import loads

    doc = "auth: none\nupstreams: {u: {url: 'http://127.0.0.1:1/mcp'}}\nadmin: {host: '%s'}\n"
    with pytest.raises(ConfigError, match="not loopback"):
        loads(doc % host)
    assert loads(doc % "127.0.0.1").section("admin").enabled


async def test_without_auth_only_loopback_clients_get_in(tmp_path: Path) -> None:
    async with console(tmp_path, auth="none", policies=[]) as (door, browser):
        r = await browser.get("/login")
        assert 'name="key"' not in r.text
        r = await browser.post("/login", data={"csrf": csrf_of(r.text)})
        assert r.status_code == 303
        assert (await browser.get("/")).status_code == 200
        assert door.records("admin.action")[-1]["principal"]["id"] == "loopback-admin"
        # The loopback admin decides approvals too (the admin API has nobody to authorise without auth).
        assert 'id="read-only"' not in (await browser.get("/approvals")).text
        app = door.app
        remote = httpx.ASGITransport(app=app.state.bastion.admin.console.asgi(), client=("192.0.2.7", 5555))
        async with httpx.AsyncClient(transport=remote, base_url="http://127.0.0.1") as other:
            other.cookies = browser.cookies
            assert (await other.get("/login")).status_code == 403
            assert (await other.get("/")).status_code == 303


async def test_a_loopback_console_answers_only_to_loopback_host_names(tmp_path: Path) -> None:
    """DNS rebinding: a page on rebind.attacker.example, resolved to 127.0.0.1, is a loopback peer; without
    ``auth`` it could log in as loopback-admin. Every path of the console's listener refuses a foreign Host (421,
    counted like the gateway's refusals) before the login form; ``admin.allowed_hosts`` adds names."""
    from starlette.routing import Mount, Route

    async with console(tmp_path, auth="none", policies=[],
                       admin={"port": 0, "allowed_hosts": ["console.internal"]}) as (door, browser):
        console_app = door.app.state.bastion.admin.console
        routes = console_app.app().routes
        paths = [(method, re.sub(r"\{[^}]*\}", "x", route.path)) for route in routes
                 if isinstance(route, Route) for method in sorted(route.methods or ())]
        paths += [("GET", route.path + "/console.css") for route in routes if isinstance(route, Mount)]
        paths += [("GET", "/nowhere"), ("POST", "/login/")]
        assert ("POST", "/login") in paths and ("POST", "/pins/x") in paths
        metrics = await door.client.get("/metrics")
        before = re.search(r'^bastion_http_refusals_total\{reason="host"\} (\S+)$', metrics.text, re.M)
        for method, path in paths:
            r = await browser.request(method, path, headers={"Host": "rebind.attacker.example:9190"})
            assert r.status_code == 421, (method, path, r.status_code)
            assert "location" not in r.headers and "set-cookie" not in r.headers
            assert r.headers["x-frame-options"] == "DENY"
        metrics = await door.client.get("/metrics")
        after = re.search(r'^bastion_http_refusals_total\{reason="host"\} (\S+)$', metrics.text, re.M)
        assert after is not None
        assert float(after.group(1)) - (float(before.group(1)) if before else 0.0) == len(paths)
        for host in ("localhost:9190", "127.0.0.1", "[::1]:9190", "console.internal"):
            assert (await browser.get("/login", headers={"Host": host})).status_code == 200, host


async def test_reject_and_a_stale_fingerprint_are_the_cli_operations(tmp_path: Path) -> None:
    async with console(tmp_path) as (door, browser):
        await login(browser)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        r = await door.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
            headers)
        headers |= {"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        await door.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
        await door.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "basic__mutate", "arguments": {}}}, headers)
        page = ""
        for _ in range(100):
            page = (await browser.get("/pins")).text
            if 'data-pin="basic/echo"' in page:
                break
            await asyncio.sleep(0.1)
        assert 'data-pin="basic/echo"' in page and "id_rsa" in page  # the diff shows the injected text
        token = csrf_of(page)
        fingerprint = re.search(r'name="fingerprint" value="([^"]+)"', page)
        assert fingerprint
        stale = {"csrf": token, "upstream": "basic", "tool": "echo", "fingerprint": "sha256:0000"}
        r = await browser.post("/pins/approve", data=stale)
        assert r.status_code == 409 and "approve failed" in r.text
        r = await browser.post("/pins/reject", data={**stale, "fingerprint": fingerprint.group(1)})
        assert r.status_code == 303
        pins = (await browser.get("/pins")).text
        assert "rejected by root" in pins
        hidden = (await browser.get("/catalogue")).text.split('id="hidden-tools"')[1]
        assert "basic__echo" in hidden
        outcomes = [(r["action"], r["outcome"], r["target"]) for r in door.records("admin.action")]
        assert ("pin.approve", "failed", "basic/echo") in outcomes and ("pin.reject", "ok", "basic/echo") in outcomes
        assert not door.records("pin.approve")


APPROVE_POLICY = POLICY + """  - id: echo-needs-an-admin
    effect: approve
    principals: {groups: [eng]}
    tools: ["basic__echo"]
    approval: {via: [admin], timeout: 30s, message: "An admin approves every echo"}
"""


async def alice_session(door: FrontDoor) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {USER_KEY}"}
    r = await door.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}, headers)
    headers |= {"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    await door.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    return headers


def held_call(door: FrontDoor, headers: dict[str, str], arguments: dict[str, Any]) -> asyncio.Task[httpx.Response]:
    return asyncio.create_task(door.post({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                          "params": {"name": "basic__echo", "arguments": arguments}}, headers))


async def pending_row(browser: httpx.AsyncClient) -> tuple[str, str]:
    """(page, approval id) once a call waits."""
    for _ in range(200):
        page = (await browser.get("/approvals")).text
        found = re.search(r'data-approval="([0-9a-f]+)"', page)
        if found:
            return page, found.group(1)
        await asyncio.sleep(0.05)
    raise AssertionError("no pending approval shown")


def tool_result(response: httpx.Response) -> dict[str, Any]:
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = [line[6:] for line in text.splitlines() if line.startswith("data: ")][-1]
    body = json.loads(text)
    assert "result" in body, body
    result: dict[str, Any] = body["result"]
    return result


async def test_an_admin_approves_and_denies_held_calls_with_the_api_records(tmp_path: Path) -> None:
    async with console(tmp_path, APPROVE_POLICY, approvals={"admin_groups": ["admin"]}) as (door, browser):
        await login(browser)
        headers = await alice_session(door)
        call = held_call(door, headers, {"message": "secret-argument"})
        page, approval_id = await pending_row(browser)
        assert "echo-needs-an-admin" in page and "alice" in page and "An admin approves every echo" in page
        assert "secret-argument" not in page and "1 hidden" in page  # audit.log_arguments is off
        token = csrf_of(page)
        # Without the token nothing is decided.
        r = await browser.post("/approvals/approve", data={"id": approval_id})
        assert r.status_code == 403 and not call.done()
        r = await browser.post("/approvals/approve", data={"id": approval_id, "csrf": token})
        assert r.status_code == 303 and r.headers["location"] == "/approvals"
        result = tool_result(await asyncio.wait_for(call, 10))
        assert result["content"][0]["text"] == "secret-argument" and not result.get("isError")
        # The first verdict wins: deciding again is refused, and recorded as failed.
        r = await browser.post("/approvals/deny", data={"id": approval_id, "csrf": token})
        assert r.status_code == 409 and "not pending" in r.text

        denied = held_call(door, headers, {"message": "no"})
        _, second = await pending_row(browser)
        r = await browser.post("/approvals/deny", data={"id": second, "csrf": token})
        assert r.status_code == 303
        result = tool_result(await asyncio.wait_for(denied, 10))
        assert result["isError"] is True and "declined by an administrator" in result["content"][0]["text"]
        assert 'id="no-approvals"' in (await browser.get("/approvals")).text

        decided = {r["approval"]["id"]: r for r in door.records("approval.decided")}
        assert decided[approval_id]["principal"]["id"] == "root"
        assert decided[approval_id]["approval"] == {
            "id": approval_id, "principal": "alice", "tool": "basic__echo", "upstream": "basic",
            "rule_id": "echo-needs-an-admin", "outcome": "approved", "channel": "console", "by": "root"}
        assert decided[second]["approval"]["outcome"] == "declined"
        actions = [(r["action"], r["outcome"], r["target"]) for r in door.records("admin.action")
                   if r["action"].startswith("approval.")]
        assert actions == [("approval.approve", "refused", None), ("approval.approve", "ok", approval_id),
                           ("approval.deny", "failed", approval_id), ("approval.deny", "ok", second)]
        calls = {r["approval"]["id"]: r for r in door.records("tool.call") if r.get("approval")}
        assert calls[approval_id]["approval"]["channel"] == "console" and calls[approval_id]["approval"]["by"] == "root"
        assert calls[second]["decision"] == "deny"
        schema = json.loads((Path(bastion.audit.__file__).parent / "schema.json").read_text())
        for record in door.records(None):
            jsonschema.Draft202012Validator(schema).validate(record)


async def test_arguments_show_only_with_log_arguments_and_then_redacted(tmp_path: Path) -> None:
    async with console(tmp_path, APPROVE_POLICY, approvals={"admin_groups": ["admin"]},
                       audit={"sinks": [{"file": str(tmp_path / "audit.jsonl")}], "log_arguments": True}) \
            as (door, browser):
        await login(browser)
        call = held_call(door, await alice_session(door), {"message": "visible-text", "api_token": "hunter2"})
        page, approval_id = await pending_row(browser)
        assert "message: visible-text" in page and "api_token: [REDACTED]" in page and "hunter2" not in page
        await browser.post("/approvals/deny", data={"id": approval_id, "csrf": csrf_of(page)})
        await asyncio.wait_for(call, 10)


async def test_admins_outside_the_approvals_groups_see_but_cannot_decide(tmp_path: Path) -> None:
    async with console(tmp_path, APPROVE_POLICY) as (door, browser):  # approvals.admin_groups: bastion-admins
        await login(browser)
        call = held_call(door, await alice_session(door), {"message": "m"})
        page, approval_id = await pending_row(browser)
        assert 'id="read-only"' in page and "bastion-admins" in page and 'class="approve"' not in page
        r = await browser.post("/approvals/approve", data={"id": approval_id, "csrf": csrf_of(page)})
        assert r.status_code == 403
        assert door.records("admin.action")[-1]["action"] == "approval.approve"
        assert door.records("admin.action")[-1]["outcome"] == "refused"
        assert not door.records("approval.decided") and not call.done()
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call


async def test_the_approvals_stream_tells_of_opened_and_decided_approvals(tmp_path: Path) -> None:
    async with console(tmp_path, APPROVE_POLICY, approvals={"admin_groups": ["admin"]}) as (door, browser):
        await login(browser)
        app = door.app
        port = app.state.bastion.admin.port
        headers = await alice_session(door)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", cookies=browser.cookies,
                                     timeout=10) as tcp, \
                tcp.stream("GET", "/approvals/stream", headers={"accept": "text/event-stream"}) as r:
            assert r.status_code == 200
            events: list[dict[str, Any]] = []
            call: asyncio.Task[httpx.Response] | None = None
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(json.loads(line[6:]))
                if events[-1]["kind"] == "sync":
                    call = held_call(door, headers, {"message": "secret-argument"})
                elif events[-1]["kind"] == "opened":
                    page = (await browser.get("/approvals")).text
                    await browser.post("/approvals/approve", data={"id": events[-1]["id"], "csrf": csrf_of(page)})
                else:
                    break
        assert [e["kind"] for e in events] == ["sync", "opened", "decided"]
        assert events[2] == {"kind": "decided", "id": events[1]["id"], "outcome": "approved"}
        assert "secret-argument" not in json.dumps(events)
        assert call is not None
        await asyncio.wait_for(call, 10)


async def test_the_catalogue_shows_what_policy_hides_from_a_chosen_principal(tmp_path: Path) -> None:
    async with console(tmp_path, APPROVE_POLICY) as (_, browser):
        await login(browser)
        page = (await browser.get("/catalogue")).text
        options = re.findall(r'<option value="([^"]*)"', page)
        assert options == ["", "alice", "root"]
        assert "sha256:" not in page and hash_key(USER_KEY) not in page
        assert 'data-why="policy"' not in page  # no principal chosen: policy is not applied
        page = (await browser.get("/catalogue", params={"principal": "alice"})).text
        listed, hidden = page.split('id="visible-tools"')[1].split('id="hidden-tools"')
        assert 'data-tool="basic__echo"' in listed and "approve: echo-needs-an-admin" in listed
        assert 'data-tool="basic__add"' not in listed
        row = re.search(r'<tr data-tool="basic__add" data-why="policy">.*?</tr>', hidden, re.S)
        assert row and "(default deny)" in row.group(0) and "hidden from alice" in row.group(0)
        page = (await browser.get("/catalogue", params={"principal": "root"})).text
        listed = page.split('id="visible-tools"')[1].split('id="hidden-tools"')[0]
        assert 'data-tool="basic__add"' in listed and "allow: admins-all" in listed
        page = (await browser.get("/catalogue", params={"principal": "mallory"})).text
        assert 'id="unknown-principal"' in page and 'data-why="policy"' not in page


async def test_the_catalogue_names_the_deny_rule_that_hides_a_tool(tmp_path: Path) -> None:
    policy = POLICY + """  - id: no-add-for-eng
    effect: deny
    principals: {groups: [eng]}
    tools: ["basic__add"]
"""
    async with console(tmp_path, policy.replace('tools: ["basic__echo"]', 'tools: ["basic__*"]', 1)) \
            as (_, browser):
        await login(browser)
        page = (await browser.get("/catalogue", params={"principal": "alice"})).text
        hidden = page.split('id="hidden-tools"')[1]
        row = re.search(r'<tr data-tool="basic__add" data-why="policy">.*?</tr>', hidden, re.S)
        assert row and '<td class="rule">no-add-for-eng</td>' in row.group(0)
        assert re.findall(r'data-why="policy"', hidden) == ['data-why="policy"']
