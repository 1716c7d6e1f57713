"""Human approval of held calls, end to end: two replicas sharing a real Redis, the official SDK as the client.

The calling user answers through its elicitation callback (yes and no); an admin approves a call waiting on
replica A through replica B's admin API; an unanswered approval times out; each outcome is in the call's own
audit record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.auth.apikeys import hash_key
from tests.audit.helpers import assert_valid
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import RpcClient, parse_body

ALICE_KEY = "bst_alice_" + "a" * 40
ADMIN_KEY = "bst_admin_" + "d" * 40

POLICY = """\
version: 1
rules:
  - id: eng-basic
    effect: allow
    principals: {groups: [eng]}
    tools: ["basic__*"]
  - id: echo-needs-ok
    effect: approve
    annotations: {destructiveHint: true}
    tools: ["basic__echo"]
    approval: {via: [user, admin], timeout: 20s, message: "Echo counts as destructive here"}
  - id: add-needs-admin
    effect: approve
    tools: ["basic__add"]
    approval: {via: [admin], timeout: 30s, message: "An admin must approve additions"}
  - id: whoami-times-out
    effect: approve
    tools: ["basic__whoami"]
    approval: {via: [admin], timeout: 1s}
  - id: grow-remembered
    effect: approve
    tools: ["basic__slow"]
    approval: {via: [user], timeout: 20s, remember: session}
"""


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[list[GatewayProcess]]:
    workdir: Path = tmp_path_factory.mktemp("approvals")
    (workdir / "policies").mkdir()
    (workdir / "policies" / "rules.yaml").write_text(POLICY)
    config = {"auth": {"api_keys": [{"id": "alice", "hash": hash_key(ALICE_KEY), "groups": ["eng"]},
                                    {"id": "root", "hash": hash_key(ADMIN_KEY), "groups": ["bastion-admins"]}]},
              "redis": {"url": redis_server.url.replace("/0", "/5")},
              "upstreams": {"basic": stdio_upstream()}, "policies": str(workdir / "policies")}
    gws = [GatewayProcess(config, workdir).start(), GatewayProcess(config, workdir).start()]
    yield gws
    for gw in gws:
        gw.stop()


def sdk(gw: GatewayProcess, http: httpx2.AsyncClient, **kw: Any) -> Client:
    return Client(streamable_http_client(gw.url, http_client=http), mode="legacy", **kw)


def alice_http() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE_KEY}"}, timeout=60)


def admin(gw: GatewayProcess, key: str | None = ADMIN_KEY) -> httpx.Client:
    return httpx.Client(base_url=gw.base, headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=10)


def call_record(gw: GatewayProcess, tool: str, count: int = 1) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [r for r in gw.records("tool.call") if r["tool"]["name"] == tool]
        if len(found) >= count:
            return found[count - 1]
        time.sleep(0.05)
    raise AssertionError(f"no tool.call record #{count} for {tool}")


async def test_the_user_approves_through_the_elicitation_form(replicas: list[GatewayProcess]) -> None:
    a, _ = replicas
    asked: list[types.ElicitRequestParams] = []

    async def yes(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"approve": True})

    async with alice_http() as http, sdk(a, http, elicitation_callback=yes) as client:
        result = await client.call_tool("basic__echo", {"message": "line one\nline two"})
    assert result.is_error is not True
    assert result.content[0].text == "line one\nline two"
    assert len(asked) == 1
    message = asked[0].message
    assert "Echo counts as destructive here" in message and "basic__echo" in message
    assert "message: line one line two" in message  # the summary has no control characters
    record = call_record(a, "basic__echo")
    assert record["outcome"] == "allowed" and record["rule_id"] == "echo-needs-ok"
    assert record["approval"]["outcome"] == "approved"
    assert record["approval"]["channel"] == "elicitation" and record["approval"]["by"] == "alice"


async def test_the_user_declines_and_the_call_is_not_run(replicas: list[GatewayProcess]) -> None:
    a, _ = replicas
    before = len([r for r in a.records("tool.call") if r["tool"]["name"] == "basic__echo"])

    async def no(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    async with alice_http() as http, sdk(a, http, elicitation_callback=no) as client:
        result = await client.call_tool("basic__echo", {"message": "never"})
    assert result.is_error is True
    assert "declined by the user" in result.content[0].text
    record = call_record(a, "basic__echo", before + 1)
    assert record["decision"] == "deny" and record["stage"] == "approval" and record["outcome"] == "denied"
    assert record["approval"]["outcome"] == "declined" and record["approval"]["channel"] == "elicitation"


async def test_an_admin_on_another_replica_approves_the_waiting_call(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    with admin(b, ALICE_KEY) as not_admin, admin(b, None) as anonymous:
        assert not_admin.get("/admin/approvals").status_code == 403
        assert not_admin.post("/admin/approvals/nope/approve").status_code == 403
        assert anonymous.get("/admin/approvals").status_code == 401
    # An authenticated caller the API refuses leaves a record, as the console's refusals do.
    refusals = [(r["principal"]["id"], r["action"], r["target"], r["outcome"]) for r in b.records("admin.action")]
    assert ("alice", "approval.list", None, "refused") in refusals
    assert ("alice", "approval.approve", "nope", "refused") in refusals

    async with alice_http() as http, sdk(a, http) as client:
        call = asyncio.create_task(client.call_tool("basic__add", {"a": 2, "b": 40}))
        pending: list[dict[str, Any]] = []
        with admin(b) as root:
            for _ in range(200):
                pending = [p for p in (await asyncio.to_thread(root.get, "/admin/approvals")).json()["approvals"]
                           if p["tool"] == "basic__add"]
                if pending:
                    break
                await asyncio.sleep(0.05)
            assert len(pending) == 1
            item = pending[0]
            assert item["principal"] == "alice" and item["rule_id"] == "add-needs-admin"
            assert item["arguments"] == {"a": "2", "b": "40"} and item["message"] == "An admin must approve additions"
            shown = (await asyncio.to_thread(root.get, f"/admin/approvals/{item['id']}")).json()
            assert shown["id"] == item["id"]
            decided = await asyncio.to_thread(root.post, f"/admin/approvals/{item['id']}/approve",
                                              json={"channel": "cli"})
            assert decided.status_code == 200 and decided.json()["outcome"] == "approved"
            # The first verdict wins: a second decision finds nothing pending (and is recorded as failed).
            again = await asyncio.to_thread(root.post, f"/admin/approvals/{item['id']}/deny")
            assert again.status_code == 409
            assert any(r["action"] == "approval.deny" and r["target"] == item["id"] and r["outcome"] == "failed"
                       and r["principal"]["id"] == "root" for r in b.records("admin.action"))
        result = await asyncio.wait_for(call, 20)
    assert result.structured_content == {"sum": 42}
    record = call_record(a, "basic__add")
    assert record["approval"] == {**record["approval"], "outcome": "approved", "channel": "cli", "by": "root",
                                  "id": item["id"]}
    decided_records = [r for r in b.records("approval.decided") if r["approval"]["id"] == item["id"]]
    assert len(decided_records) == 1 and decided_records[0]["principal"]["id"] == "root"


async def test_an_admin_may_not_approve_their_own_call(replicas: list[GatewayProcess]) -> None:
    # root is in the admin group and calls a tool whose rule wants an admin's approval: through the admin API (and
    # so the CLI) root's own approval is refused, with the reason; declining it is root's to do.
    a, b = replicas
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60) as http, \
            sdk(a, http) as client:
        call = asyncio.create_task(client.call_tool("basic__add", {"a": 1, "b": 1}))
        pending: list[dict[str, Any]] = []
        with admin(b) as root:
            for _ in range(200):
                pending = [p for p in (await asyncio.to_thread(root.get, "/admin/approvals")).json()["approvals"]
                           if p["tool"] == "basic__add" and p["principal"] == "root"]
                if pending:
                    break
                await asyncio.sleep(0.05)
            assert len(pending) == 1
            approval_id = pending[0]["id"]
            refused = await asyncio.to_thread(root.post, f"/admin/approvals/{approval_id}/approve",
                                              json={"channel": "cli"})
            assert refused.status_code == 403
            assert "may not approve their own call" in refused.json()["error"]
            assert any(r["action"] == "approval.approve" and r["target"] == approval_id and r["outcome"] == "refused"
                       and "may not approve" in r["detail"] for r in b.records("admin.action"))
            declined = await asyncio.to_thread(root.post, f"/admin/approvals/{approval_id}/deny")
            assert declined.status_code == 200 and declined.json()["outcome"] == "declined"
        result = await asyncio.wait_for(call, 20)
    assert result.is_error
    record = call_record(a, "basic__add", count=len([r for r in a.records("tool.call")
                                                     if r["tool"]["name"] == "basic__add"]))
    assert record["principal"]["id"] == "root"
    assert record["approval"]["outcome"] == "declined" and record["approval"]["by"] == "root"


async def test_an_unanswered_approval_times_out_with_a_clear_tool_error(replicas: list[GatewayProcess]) -> None:
    a, _ = replicas
    async with alice_http() as http, sdk(a, http) as client:
        started = time.monotonic()
        result = await client.call_tool("basic__whoami", {})
        waited = time.monotonic() - started
    assert result.is_error is True and "none came within 1 s" in result.content[0].text
    assert waited >= 1.0
    record = call_record(a, "basic__whoami")
    assert record["approval"]["outcome"] == "timed_out" and record["stage"] == "approval"
    with admin(a) as root:
        assert all(p["tool"] != "basic__whoami" for p in root.get("/admin/approvals").json()["approvals"])


async def test_a_user_only_approval_needs_a_client_that_can_be_asked(replicas: list[GatewayProcess]) -> None:
    a, _ = replicas
    async with alice_http() as http, sdk(a, http) as client:  # no elicitation callback: not declared
        result = await client.call_tool("basic__slow", {"seconds": 0, "steps": 1})
    assert result.is_error is True and "cannot be asked" in result.content[0].text


async def test_remember_session_asks_once_per_session(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    asked: list[str] = []

    async def yes(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    async with alice_http() as http, sdk(a, http, elicitation_callback=yes) as client:
        for _ in range(3):
            result = await client.call_tool("basic__slow", {"seconds": 0, "steps": 1})
            assert result.is_error is not True
    assert len(asked) == 1
    async with alice_http() as http, sdk(b, http, elicitation_callback=yes) as client:
        await client.call_tool("basic__slow", {"seconds": 0, "steps": 1})
    assert len(asked) == 2  # a new session asks again
    channels = [r["approval"]["channel"] for r in a.records("tool.call") if r["tool"]["name"] == "basic__slow"
                and r["approval"]["outcome"] == "approved"]
    assert channels == ["elicitation", "remembered", "remembered"]


def test_cancelling_the_call_withdraws_the_approval(replicas: list[GatewayProcess]) -> None:
    a, _ = replicas

    rpc = RpcClient(a.url, {"Authorization": f"Bearer {ALICE_KEY}"})
    rpc.initialize()
    body = {"jsonrpc": "2.0", "id": 77, "method": "tools/call",
            "params": {"name": "basic__add", "arguments": {"a": 1, "b": 1}}}
    # The held call's request blocks until it ends, so it runs on its own thread while the test cancels it.
    def post_held() -> None:
        with contextlib.suppress(httpx.HTTPError):
            rpc.post(body)

    held = threading.Thread(target=post_held)
    held.start()
    with admin(a) as root:
        for _ in range(200):
            if mine(root):
                break
            time.sleep(0.05)
        assert mine(root)
        rpc.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 77}})
        for _ in range(200):
            if not mine(root):
                break
            time.sleep(0.05)
        assert not mine(root)
    held.join(20)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        record = [r for r in a.records("tool.call") if r["tool"]["name"] == "basic__add"
                  and r.get("approval", {}).get("outcome") == "withdrawn"]
        if record:
            break
        time.sleep(0.05)
    assert record and record[-1]["outcome"] == "client_disconnected"


def mine(root: httpx.Client) -> bool:
    return any(p["arguments"] == {"a": "1", "b": "1"} for p in root.get("/admin/approvals").json()["approvals"])


async def test_the_cli_lists_and_denies_on_another_replica(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    env = {**os.environ, "BASTION_URL": b.base, "BASTION_TOKEN": ADMIN_KEY}

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bastion", "approvals", *argv], env=env, capture_output=True,
                              text=True, timeout=30, check=False)

    async with alice_http() as http, sdk(a, http) as client:
        call = asyncio.create_task(client.call_tool("basic__add", {"a": 5, "b": 5}))
        found: list[dict[str, Any]] = []
        for _ in range(100):
            listed = await asyncio.to_thread(cli, "list", "--json")
            assert listed.returncode == 0, listed.stderr
            found = [p for p in json.loads(listed.stdout)["approvals"] if p["arguments"] == {"a": "5", "b": "5"}]
            if found:
                break
            await asyncio.sleep(0.1)
        assert found
        shown = await asyncio.to_thread(cli, "show", found[0]["id"])
        assert shown.returncode == 0 and "add-needs-admin" in shown.stdout
        denied = await asyncio.to_thread(cli, "deny", found[0]["id"])
        assert denied.returncode == 0 and "declined by root" in denied.stdout
        assert (await asyncio.to_thread(cli, "deny", found[0]["id"])).returncode == 1  # no longer pending
        result = await asyncio.wait_for(call, 20)
    assert result.is_error is True and "declined by an administrator" in result.content[0].text
    record = [r for r in a.records("tool.call") if r.get("approval", {}).get("id") == found[0]["id"]]
    assert record and record[0]["approval"]["channel"] == "cli" and record[0]["approval"]["outcome"] == "declined"


@pytest.mark.parametrize("approve", [True, False])
async def test_a_2026_07_28_client_is_asked_through_input_required(replicas: list[GatewayProcess],
                                                                   approve: bool) -> None:
    a, _ = replicas
    asked: list[str] = []
    message = f"modern {approve}"

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": approve})

    async with alice_http() as http, Client(streamable_http_client(a.url, http_client=http),
                                            elicitation_callback=answer) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool("basic__echo", {"message": message})
    assert len(asked) == 1 and f"message: {message}" in asked[0]
    records = [r for r in a.records("tool.call") if r["era"] == "modern" and r["tool"]["name"] == "basic__echo"]
    final = records[-1]
    assert records[-2]["approval"]["outcome"] == "asked"  # the round that carried the question
    if approve:
        assert result.is_error is not True and result.content[0].text == message
        assert final["approval"]["outcome"] == "approved" and final["approval"]["channel"] == "elicitation"
    else:
        assert result.is_error is True and "declined by the user" in result.content[0].text
        assert final["approval"]["outcome"] == "declined" and final["stage"] == "approval"


def test_a_forged_answer_without_bastions_state_is_not_an_approval(replicas: list[GatewayProcess]) -> None:
    a, _ = replicas
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "basic__echo", "arguments": {"message": "forged"},
                       "inputResponses": {"bastion-approval": {"action": "accept", "content": {"approve": True}}},
                       "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                 "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
                                 "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}}}
    response = httpx.post(a.url, json=body, timeout=10, headers={
        "Authorization": f"Bearer {ALICE_KEY}", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "basic__echo"})
    result = [m for m in parse_body(response) if m.get("id") == 1][-1]["result"]
    assert result["resultType"] == "input_required" and "bastion-approval" in result["inputRequests"]


def test_every_record_written_matches_the_audit_schema(replicas: list[GatewayProcess]) -> None:
    records = [r for gw in replicas for r in gw.records() if r.get("kind") == "audit"]
    assert any("approval" in r for r in records if r["event"] == "tool.call")
    assert any(r["event"] == "approval.decided" for r in records)
    for record in records:
        assert_valid(record)
    metrics = httpx.get(replicas[0].base + "/metrics", timeout=10).text
    assert 'bastion_approvals_total{channel="elicitation",outcome="approved"}' in metrics
    assert 'bastion_approvals_total{channel="gateway",outcome="timed_out"} 1.0' in metrics
