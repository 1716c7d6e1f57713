"""A stdio server that starts helper processes: they inherit its stdin, stdout and stderr.

The server is the process bastion started. When it exits, the connection is lost at once, though a helper still
holds its stdout (no EOF comes while one does), and what it left in its process group is killed; ``close`` ends
the server and its helpers. A helper that left the group (its own session) is out of bastion's reach, but holds
nothing up: bastion closes its own ends of the pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.errors import UpstreamUnavailable
from bastion.upstream.stdio import StdioUpstream
from tests.upstream.helpers import ROOT, Inbox, server_command

FLAKY = "tests.fixtures.flaky_server"
# Bounds on waiting for what must happen; a failure, never a measurement.
PATIENCE_S = 30.0


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by whoever inherited it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


async def wait_gone(pid: int) -> bool:
    for _ in range(int(PATIENCE_S * 10)):
        if gone(pid):
            return True
        await asyncio.sleep(0.1)
    return False


@pytest.fixture
def helpers(tmp_path: Path) -> Iterator[list[Path]]:
    """Pid files the helpers write; whatever still runs at the end is killed (by pid)."""
    files: list[Path] = []
    yield files
    for file in files:
        if file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(file.read_text()), signal.SIGKILL)


def flaky(tmp_path: Path) -> StdioUpstream:
    command = server_command("--transport", "stdio", "--record", str(tmp_path / "runs"), module=FLAKY)
    return StdioUpstream("flaky", command, cwd=str(ROOT), era="legacy", backoff_initial=0.1, shutdown_grace=1.0)


async def echo(up: StdioUpstream) -> str:
    result = await up.request("tools/call", {"name": "echo", "arguments": {}}, timeout=10)
    return str(result["content"][0]["text"])


@pytest.mark.parametrize("escape", [False, True], ids=["in-group", "own-session"])
async def test_a_server_that_dies_leaving_a_helper_on_its_stdout_is_restarted(
        tmp_path: Path, helpers: list[Path], escape: bool) -> None:
    pid_file = tmp_path / "helper.pid"
    helpers.append(pid_file)
    inbox = Inbox()
    up = flaky(tmp_path)
    await up.start(inbox)
    try:
        assert await echo(up) == "run 1"
        # Before: no EOF while the helper held stdout, so the call waited for its whole timeout, and the upstream
        # stayed "connected" to a dead server.
        with pytest.raises(UpstreamUnavailable):
            await up.request("tools/call", {"name": "helper", "arguments": {
                "pid_file": str(pid_file), "exit": True, "escape": escape}}, timeout=PATIENCE_S)
        await inbox.wait_for("notifications/tools/list_changed", timeout=PATIENCE_S)
        assert await echo(up) == "run 2"
        helper = int(pid_file.read_text())
        if escape:
            assert not gone(helper)  # out of the group: not bastion's to kill
        else:
            assert await wait_gone(helper)
    finally:
        await up.close()


@pytest.mark.parametrize("escape", [False, True], ids=["in-group", "own-session"])
async def test_close_ends_the_helpers_too(tmp_path: Path, helpers: list[Path], escape: bool) -> None:
    pid_file = tmp_path / "helper.pid"
    helpers.append(pid_file)
    up = flaky(tmp_path)
    await up.start(Inbox())
    await up.request("tools/call", {"name": "helper", "arguments": {"pid_file": str(pid_file), "escape": escape}},
                     timeout=10)
    server = up.pid
    assert server is not None
    # Before: the helper was left running. (The bound: ``Process.wait`` also waits for pipes a helper holds.)
    async with asyncio.timeout(PATIENCE_S):
        await up.close()
    assert gone(server)
    helper = int(pid_file.read_text())
    if escape:
        assert not gone(helper)
    else:
        assert await wait_gone(helper)
