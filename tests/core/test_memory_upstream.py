"""The memory upstream keeps the ``Upstream`` contract the way the transports do (tests/upstream/test_contract.py),
so what the in-process tests of the core observe through it is what a real upstream would show."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from bastion.errors import UpstreamRpcError, UpstreamTimeout, UpstreamUnavailable
from bastion.upstream.base import Upstream
from tests.support.memory_upstream import MemoryUpstream, tool


async def ignore(method: str, params: Mapping[str, Any]) -> None:
    return None


async def test_it_is_an_upstream_and_unreachable_until_started() -> None:
    up: Upstream = MemoryUpstream("notes", tools=[tool("echo")])
    assert up.info is None
    with pytest.raises(UpstreamUnavailable):
        await up.request("ping", None, timeout=1)
    info = await up.start(ignore)
    assert (info.era, info.protocol_version, "tools" in info.capabilities) == ("legacy", "2025-11-25", True)
    await up.close()
    with pytest.raises(UpstreamUnavailable):
        await up.request("ping", None, timeout=1)


async def test_lists_paginate_and_unknown_methods_are_errors() -> None:
    up = MemoryUpstream("notes", tools=[tool(f"t{i}") for i in range(5)], page_size=2)
    await up.start(ignore)
    names, cursor, pages = [], None, 0
    while True:
        page = await up.request("tools/list", {"cursor": cursor} if cursor else None, timeout=1)
        names += [t["name"] for t in page["tools"]]
        pages += 1
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    assert (names, pages) == (["t0", "t1", "t2", "t3", "t4"], 3)
    with pytest.raises(UpstreamRpcError) as info:
        await up.request("no/such/method", {}, timeout=1)
    assert info.value.code == -32601


async def test_a_timeout_is_raised_and_the_request_cancelled() -> None:
    up = MemoryUpstream("notes", tools=[tool("slow")])
    up.script("tools/call", "slow", delay=30)
    await up.start(ignore)
    with pytest.raises(UpstreamTimeout):
        await up.request("tools/call", {"name": "slow", "arguments": {}}, timeout=0.05)
    assert up.cancelled == [("tools/call", {"name": "slow", "arguments": {}})]


async def test_cancelling_the_caller_cancels_the_request() -> None:
    up = MemoryUpstream("notes", tools=[tool("slow")])
    up.script("tools/call", "slow", delay=30)
    await up.start(ignore)
    call = asyncio.create_task(up.request("tools/call", {"name": "slow"}, timeout=60))
    await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert up.cancelled == [("tools/call", {"name": "slow"})]


async def test_announcements_reach_on_notification() -> None:
    heard: list[str] = []

    async def on_notification(method: str, params: Mapping[str, Any]) -> None:
        heard.append(method)

    up = MemoryUpstream("notes")
    await up.start(on_notification)
    await up.announce("notifications/tools/list_changed")
    assert heard == ["notifications/tools/list_changed"]
