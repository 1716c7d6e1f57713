"""The ``Upstream`` contract, checked the same way for every transport against the real fixture server."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from bastion.errors import UpstreamRpcError, UpstreamTimeout
from bastion.upstream.base import Upstream
from bastion.upstream.connections import H1Pool
from bastion.upstream.http import HttpUpstream
from bastion.upstream.http_sse import SseUpstream
from bastion.upstream.stdio import StdioUpstream
from tests.upstream.helpers import ROOT, SAMPLING_ANSWER, HttpServer, Inbox, server_command

# "streamable-http-fast" is the same transport with its POSTs on the lean keep-alive pool, as build_upstream wires it.
TRANSPORTS = ["stdio", "streamable-http", "streamable-http-fast", "sse"]


@pytest.fixture(scope="module")
def http_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, HttpServer]]:
    """One fixture server per HTTP transport for the module; each test still opens its own MCP session."""
    servers: dict[str, HttpServer] = {}
    try:
        for kind in ("streamable-http", "sse"):
            record = tmp_path_factory.mktemp(kind) / "calls.jsonl"
            servers[kind] = HttpServer(kind, record, ("--page-size", "3")).start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(params=TRANSPORTS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def record(kind: str, tmp_path: Path, http_servers: dict[str, HttpServer]) -> Path:
    server = kind.removesuffix("-fast")
    return http_servers[server].record if server in http_servers else tmp_path / "calls.jsonl"


@pytest.fixture
async def upstream(kind: str, record: Path, http_servers: dict[str, HttpServer]
                   ) -> AsyncIterator[tuple[Upstream, Inbox]]:
    inbox = Inbox()
    up: Upstream
    fast = H1Pool("basic")
    async with httpx.AsyncClient() as client:
        if kind == "stdio":
            up = StdioUpstream("basic", server_command("--record", str(record), "--page-size", "3"), cwd=str(ROOT),
                               era="legacy")
        elif kind == "sse":
            up = SseUpstream("basic", http_servers[kind].base + "/sse", {}, client)
        else:
            up = HttpUpstream("basic", http_servers["streamable-http"].base + "/mcp", {}, client,
                              fast=fast if kind.endswith("-fast") else None)
        async with asyncio.timeout(20):
            await up.start(inbox)
        try:
            yield up, inbox
        finally:
            await up.close()
            await fast.aclose()


def recorded(record: Path) -> list[dict[str, object]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


async def wait_recorded(record: Path, entry: dict[str, object]) -> None:
    async with asyncio.timeout(15):
        while entry not in recorded(record):
            await asyncio.sleep(0.05)


async def test_initialize_reports_a_legacy_server(upstream: tuple[Upstream, Inbox]) -> None:
    up, _ = upstream
    assert up.info is not None
    assert up.info.era == "legacy"
    assert up.info.protocol_version == "2025-11-25"
    assert up.info.server_info["name"] == "basic-server"
    assert "tools" in up.info.capabilities


async def test_tools_list_paginates(upstream: tuple[Upstream, Inbox]) -> None:
    up, _ = upstream
    names: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        result = await up.request("tools/list", {"cursor": cursor} if cursor else {}, timeout=10)
        pages += 1
        names += [t["name"] for t in result["tools"]]
        cursor = result.get("nextCursor")
        if cursor is None:
            break
    # Other tests on the shared server may have grown the list, never shrunk it.
    assert pages >= 3
    assert names[:3] == ["echo", "add", "slow"]
    assert len(names) == len(set(names))
    assert "whoami" in names


async def test_call_returns_structured_content(upstream: tuple[Upstream, Inbox], record: Path) -> None:
    up, _ = upstream
    a = uuid.uuid4().int % 1000
    result = await up.request("tools/call", {"name": "add", "arguments": {"a": a, "b": 3}}, timeout=10)
    assert result["structuredContent"] == {"sum": a + 3}
    assert {"name": "add", "arguments": {"a": a, "b": 3}} in recorded(record)


async def test_tool_error_is_a_result(upstream: tuple[Upstream, Inbox]) -> None:
    up, _ = upstream
    result = await up.request("tools/call", {"name": "fail", "arguments": {}}, timeout=10)
    assert result["isError"] is True


async def test_jsonrpc_error_is_raised(upstream: tuple[Upstream, Inbox]) -> None:
    up, _ = upstream
    with pytest.raises(UpstreamRpcError) as info:
        await up.request("no/such/method", {}, timeout=10)
    assert info.value.code == -32601


async def test_progress_reaches_on_message_with_the_callers_token(upstream: tuple[Upstream, Inbox]) -> None:
    up, _ = upstream
    related = Inbox()
    params = {"name": "slow", "arguments": {"seconds": 0.2, "steps": 2}, "_meta": {"progressToken": "client-tok"}}
    result = await up.request("tools/call", params, timeout=10, on_message=related)
    assert result["content"][0]["text"] == "done"
    progress = related.of("notifications/progress")
    assert [p["progress"] for p in progress] == [1, 2]
    assert {p["progressToken"] for p in progress} == {"client-tok"}


async def test_sampling_request_is_answered_through_on_message(upstream: tuple[Upstream, Inbox]) -> None:
    up, _ = upstream
    related = Inbox({"sampling/createMessage": SAMPLING_ANSWER})
    result = await up.request("tools/call", {"name": "ask_llm", "arguments": {"prompt": "meaning?"}}, timeout=10,
                              on_message=related)
    assert result["content"][0]["text"] == "forty-two"
    [asked] = related.of("sampling/createMessage")
    assert asked["messages"][0]["content"]["text"] == "meaning?"


async def test_timeout_cancels_the_upstream_request(upstream: tuple[Upstream, Inbox], record: Path) -> None:
    up, _ = upstream
    args = {"seconds": 30, "steps": 30, "tag": f"timeout-{uuid.uuid4()}"}
    with pytest.raises(UpstreamTimeout):
        await up.request("tools/call", {"name": "slow", "arguments": args}, timeout=0.5)
    await wait_recorded(record, {"cancelled": "slow", "arguments": args})
    # The connection is still good afterwards.
    result = await up.request("tools/call", {"name": "echo", "arguments": {"message": "hi"}}, timeout=10)
    assert result["content"][0]["text"] == "hi"


async def test_cancelling_the_caller_cancels_the_upstream_request(upstream: tuple[Upstream, Inbox],
                                                                   record: Path) -> None:
    up, _ = upstream
    args = {"seconds": 30, "steps": 30, "tag": f"cancel-{uuid.uuid4()}"}
    call = asyncio.ensure_future(up.request("tools/call", {"name": "slow", "arguments": args}, timeout=60))
    await wait_recorded(record, {"name": "slow", "arguments": args})
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await wait_recorded(record, {"cancelled": "slow", "arguments": args})


async def test_list_changed_reaches_on_notification(upstream: tuple[Upstream, Inbox]) -> None:
    up, inbox = upstream
    result = await up.request("tools/call", {"name": "grow", "arguments": {}}, timeout=10)
    assert result["content"][0]["text"].startswith("extra_")
    await inbox.wait_for("notifications/tools/list_changed")


async def test_resources_prompts_and_completion(upstream: tuple[Upstream, Inbox]) -> None:
    up, _ = upstream
    assert (await up.request("resources/list", None, timeout=10))["resources"][0]["uri"] == "memo://readme"
    templates = await up.request("resources/templates/list", None, timeout=10)
    assert templates["resourceTemplates"][0]["uriTemplate"] == "memo://notes/{id}"
    read = await up.request("resources/read", {"uri": "memo://notes/7"}, timeout=10)
    assert read["contents"][0]["text"] == "contents of memo://notes/7"
    prompt = await up.request("prompts/get", {"name": "greet", "arguments": {"language": "french"}}, timeout=10)
    assert prompt["messages"][0]["content"]["text"] == "Say hello in french"
    done = await up.request("completion/complete", {"ref": {"type": "ref/prompt", "name": "greet"},
                                                     "argument": {"name": "language", "value": "e"}}, timeout=10)
    assert done["completion"]["values"] == ["english", "esperanto"]


async def test_large_messages_pass(upstream: tuple[Upstream, Inbox]) -> None:
    up, _ = upstream
    big = "x" * (3 * 1024 * 1024)
    result = await up.request("tools/call", {"name": "echo", "arguments": {"message": big}}, timeout=30)
    assert result["content"][0]["text"] == big


async def test_concurrent_calls_are_correlated(upstream: tuple[Upstream, Inbox]) -> None:
    up, _ = upstream
    results = await asyncio.gather(*(
        up.request("tools/call", {"name": "echo", "arguments": {"message": str(i)}}, timeout=10) for i in range(20)))
    assert [r["content"][0]["text"] for r in results] == [str(i) for i in range(20)]
