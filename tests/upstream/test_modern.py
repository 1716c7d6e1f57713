"""Modern (2026-07-28) upstreams over stdio and Streamable HTTP, against the SDK-built fixture server: era
detection, what reaches the server, dropped tools, multi round-trip pass-through, cancellation and listen."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion.errors import UpstreamTimeout
from bastion.upstream.base import EraSetting, Upstream
from bastion.upstream.connections import H1Pool
from bastion.upstream.http_auto import AutoHttpUpstream
from bastion.upstream.modern import CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY, PROTOCOL_VERSION_KEY
from bastion.upstream.stdio import StdioUpstream
from tests.upstream.helpers import ROOT, HttpServer, Inbox, modern_command

MODERN = "tests.fixtures.modern_server"
ELICITATION = {"_meta": {CLIENT_CAPABILITIES_KEY: {"elicitation": {}}}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, HttpServer]]:
    """A dual-era and a legacy-only fixture server over HTTP, shared by the module."""
    started: dict[str, HttpServer] = {}
    try:
        for era in ("dual", "legacy"):
            record = tmp_path_factory.mktemp(era) / "calls.jsonl"
            started[era] = HttpServer("streamable-http", record, ("--era", era), module=MODERN).start()
        yield started
    finally:
        for server in started.values():
            server.stop()


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def wait_for_record(path: Path, key: str, timeout: float = 15.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            found = [r for r in records(path) if key in r]
            if found:
                return found[-1]
            await asyncio.sleep(0.05)


# "http-fast": the HTTP transport with its POSTs on the lean keep-alive pool, as build_upstream wires it.
@pytest.fixture(params=["stdio", "http", "http-fast"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def modern(transport: str, tmp_path: Path, servers: dict[str, HttpServer]
                 ) -> AsyncIterator[tuple[Upstream, Inbox, Path]]:
    """An auto-era upstream connected to the dual-era fixture, over each transport."""
    inbox = Inbox()
    async with httpx.AsyncClient() as client:
        up: Upstream
        if transport == "stdio":
            record = tmp_path / "calls.jsonl"
            up = StdioUpstream("modern", modern_command("--record", str(record)), cwd=str(ROOT), era="auto")
        else:
            record = servers["dual"].record
            up = AutoHttpUpstream("modern", servers["dual"].base + "/mcp", {"Authorization": "Bearer up"}, client,
                                  fast=H1Pool("modern") if transport == "http-fast" else None)
        async with asyncio.timeout(20):
            await up.start(inbox)
        try:
            yield up, inbox, record
        finally:
            await up.close()


async def test_a_modern_server_is_detected_and_described(modern: tuple[Upstream, Inbox, Path]) -> None:
    up, _, _ = modern
    assert up.info is not None
    assert (up.info.era, up.info.protocol_version) == ("modern", "2026-07-28")
    assert up.info.server_info["name"] == "modern-server"
    assert up.info.instructions == "A modern fixture."
    assert up.info.capabilities["tools"] == {"listChanged": True}


async def test_invalid_header_tools_are_dropped(modern: tuple[Upstream, Inbox, Path]) -> None:
    up, _, _ = modern
    listed = await up.request("tools/list", None, timeout=10)
    names = [t["name"] for t in listed["tools"]]
    assert "bad_header" not in names
    assert {"echo", "route", "confirm", "slow", "grow"} <= set(names)


async def test_every_request_carries_the_envelope(modern: tuple[Upstream, Inbox, Path]) -> None:
    up, _, record = modern
    result = await up.request("tools/call", {"name": "echo", "arguments": {"message": "hi"},
                                             "_meta": {"progressToken": "client-token"}}, timeout=10)
    assert result["content"][0]["text"] == "hi"
    seen = [r for r in records(record) if r.get("method") == "tools/call"][-1]["params"]
    meta = seen["_meta"]
    assert meta[PROTOCOL_VERSION_KEY] == "2026-07-28"
    assert meta[CLIENT_CAPABILITIES_KEY] == {}
    assert meta[CLIENT_INFO_KEY]["name"] == "bastion"
    assert meta["progressToken"] != "client-token"  # ours, unique per upstream


async def test_input_required_passes_through_and_the_retry_completes(modern: tuple[Upstream, Inbox, Path]) -> None:
    up, _, record = modern
    first = await up.request("tools/call", {"name": "confirm", "arguments": {"action": "deploy"}, **ELICITATION},
                             timeout=10)
    assert first["resultType"] == "input_required"
    assert first["inputRequests"]["ok"]["method"] == "elicitation/create"
    state = first["requestState"]
    retry = {"name": "confirm", "arguments": {"action": "deploy"}, **ELICITATION, "requestState": state,
             "inputResponses": {"ok": {"action": "accept", "content": {"sure": True}}}}
    done = await up.request("tools/call", retry, timeout=10)
    assert done.get("resultType", "complete") == "complete"
    assert done["content"][0]["text"] == 'confirmed deploy: {"sure": true}'
    seen = [r["params"] for r in records(record) if r.get("method") == "tools/call"][-1]
    assert seen["requestState"] == state
    assert seen["inputResponses"] == retry["inputResponses"]


async def test_a_timeout_cancels_the_upstream_work(modern: tuple[Upstream, Inbox, Path]) -> None:
    up, _, record = modern
    with pytest.raises(UpstreamTimeout):
        await up.request("tools/call", {"name": "slow", "arguments": {"seconds": 30}}, timeout=0.5)
    # stdio: notifications/cancelled; HTTP: the response stream was closed. Either way the handler stopped.
    assert (await wait_for_record(record, "cancelled"))["cancelled"] == "slow"
    assert (await up.request("tools/call", {"name": "echo", "arguments": {"message": "still"}}, timeout=10)
            )["content"][0]["text"] == "still"


async def test_list_changes_arrive_through_listen(modern: tuple[Upstream, Inbox, Path]) -> None:
    up, inbox, _ = modern
    await up.request("tools/list", None, timeout=10)
    # The listener's acknowledgement may trail start(); a grow before it would go unheard, so grow until heard.
    async with asyncio.timeout(15):
        while not inbox.of("notifications/tools/list_changed"):
            await up.request("tools/call", {"name": "grow", "arguments": {}}, timeout=10)
            await asyncio.sleep(0.2)
    listed = await up.request("tools/list", None, timeout=10)
    assert any(t["name"].startswith("extra_") for t in listed["tools"])


async def test_headers_mirror_the_body_over_http(servers: dict[str, HttpServer]) -> None:
    async with httpx.AsyncClient() as client:
        up = AutoHttpUpstream("modern", servers["dual"].base + "/mcp", {"Authorization": "Bearer up"}, client)
        await up.start(Inbox())
        try:
            await up.request("tools/list", None, timeout=10)
            result = await up.request("tools/call", {"name": "route", "arguments": {
                "region": "Zürich ", "count": 7, "note": "not mirrored"}}, timeout=10)
        finally:
            await up.close()
    headers = result["structuredContent"]
    assert headers["authorization"] == "Bearer up"
    assert headers["mcp-protocol-version"] == "2026-07-28"
    assert headers["mcp-method"] == "tools/call"
    assert headers["mcp-name"] == "route"
    assert headers["mcp-param-region"] == "=?base64?" + base64.b64encode("Zürich ".encode()).decode() + "?="
    assert headers["mcp-param-count"] == "7"
    assert not any(k.startswith("mcp-param-note") for k in headers)
    assert "mcp-session-id" not in headers


async def test_a_stale_tool_view_is_refreshed_on_header_mismatch(servers: dict[str, HttpServer]) -> None:
    async with httpx.AsyncClient() as client:
        up = AutoHttpUpstream("modern", servers["dual"].base + "/mcp", {}, client)
        await up.start(Inbox())
        try:
            # No tools/list yet, so no Mcp-Param headers: the server refuses with -32020 and we re-list and retry.
            result = await up.request("tools/call", {"name": "route", "arguments": {"region": "eu"}}, timeout=10)
        finally:
            await up.close()
    assert result["structuredContent"]["mcp-param-region"] == "eu"


@pytest.mark.parametrize("era", ["auto", "legacy"])
async def test_a_legacy_only_http_server_gets_the_handshake(servers: dict[str, HttpServer], era: EraSetting) -> None:
    async with httpx.AsyncClient() as client:
        up = AutoHttpUpstream("old", servers["legacy"].base + "/mcp", {}, client, era=era)
        info = await up.start(Inbox())
        try:
            assert info.era == "legacy"
            assert up.era == "legacy"
            result = await up.request("tools/call", {"name": "route", "arguments": {"region": "eu"}}, timeout=10)
            listed = await up.request("tools/list", None, timeout=10)
        finally:
            await up.close()
    assert result["structuredContent"]["mcp-session-id"]
    assert "mcp-method" not in result["structuredContent"]
    # Handshake-era clients have no x-mcp-header rules, so nothing is dropped.
    assert "bad_header" in [t["name"] for t in listed["tools"]]


async def test_pinned_legacy_talks_handshake_to_a_dual_era_server(servers: dict[str, HttpServer], tmp_path: Path
                                                                  ) -> None:
    async with httpx.AsyncClient() as client:
        up = AutoHttpUpstream("pinned", servers["dual"].base + "/mcp", {}, client, era="legacy")
        info = await up.start(Inbox())
        await up.close()
    assert info.era == "legacy"
    stdio = StdioUpstream("pinned", modern_command(), cwd=str(ROOT), era="legacy")
    try:
        assert (await stdio.start(Inbox())).era == "legacy"
    finally:
        await stdio.close()


async def test_pinned_modern_skips_the_probe(servers: dict[str, HttpServer]) -> None:
    async with httpx.AsyncClient() as client:
        up = AutoHttpUpstream("pinned", servers["dual"].base + "/mcp", {}, client, era="modern")
        info = await up.start(Inbox())
        await up.close()
    assert info.era == "modern"


async def test_a_legacy_only_stdio_server_gets_the_handshake() -> None:
    up = StdioUpstream("old", modern_command("--era", "legacy"), cwd=str(ROOT), era="auto")
    try:
        info = await up.start(Inbox())
        listed = await up.request("tools/list", None, timeout=10)
    finally:
        await up.close()
    assert info.era == "legacy"
    assert "bad_header" in [t["name"] for t in listed["tools"]]


async def test_a_silent_probe_falls_back_to_the_handshake(tmp_path: Path) -> None:
    # A server that ignores what it does not understand: the probe times out, initialize works.
    script = tmp_path / "silent.py"
    script.write_text(
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    msg = json.loads(line)\n"
        "    if msg.get('method') == 'initialize':\n"
        "        print(json.dumps({'jsonrpc': '2.0', 'id': msg['id'], 'result': {'protocolVersion': '2025-06-18',"
        " 'capabilities': {}, 'serverInfo': {'name': 'silent', 'version': '0'}}}), flush=True)\n")
    import sys

    up = StdioUpstream("silent", [sys.executable, str(script)], era="auto", probe_timeout=0.5)
    try:
        info = await up.start(Inbox())
    finally:
        await up.close()
    assert (info.era, info.protocol_version) == ("legacy", "2025-06-18")
