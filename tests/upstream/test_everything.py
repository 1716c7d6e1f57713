"""Interoperability: the reference ``@modelcontextprotocol/server-everything`` (npm) as a stdio upstream."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.upstream.stdio import StdioUpstream
from tests.support import peers
from tests.upstream.helpers import Inbox


@pytest.fixture(scope="session")
def everything_bin() -> Path:
    return peers.everything_bin()


async def test_reference_server_over_stdio(everything_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASTION_TEST_SECRET", "do-not-leak")
    up = StdioUpstream("everything", [str(everything_bin), "stdio"], env={"CONFIGURED": "yes"})
    info = await up.start(Inbox())
    try:
        assert info.era == "legacy"
        assert info.protocol_version == "2025-11-25"
        names = [t["name"] for t in (await up.request("tools/list", None, timeout=10))["tools"]]
        assert {"echo", "get-sum", "trigger-long-running-operation"} <= set(names)

        echoed = await up.request("tools/call", {"name": "echo", "arguments": {"message": "hi"}}, timeout=10)
        assert "hi" in echoed["content"][0]["text"]

        related = Inbox()
        params = {"name": "trigger-long-running-operation", "arguments": {"duration": 0.3, "steps": 3},
                  "_meta": {"progressToken": "tok"}}
        await up.request("tools/call", params, timeout=20, on_message=related)
        progress = related.of("notifications/progress")
        assert len(progress) == 3
        assert {p["progressToken"] for p in progress} == {"tok"}

        env = await up.request("tools/call", {"name": "get-env", "arguments": {}}, timeout=10)
        dumped = env["content"][0]["text"]
        assert "CONFIGURED" in dumped
        assert "do-not-leak" not in dumped
    finally:
        await up.close()
