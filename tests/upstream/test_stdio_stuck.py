"""A stdio server that runs but can no longer be talked to is replaced, not kept for ever.

Two ways a live child stops being reachable: it closes its stdin (``deaf``: the transport sees its pipe go and
replaces the child after the shutdown grace period, whatever its health), or it stops reading and answering
(``freeze``: only its health can tell, and the pool asks the transport to ``restart`` it when it is ``down``;
``tests/faults/test_stuck_upstream.py`` runs that through a gateway).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bastion.errors import UpstreamTimeout, UpstreamUnavailable
from bastion.upstream.stdio import StdioUpstream
from tests.faults.procs import alive
from tests.upstream.helpers import LOOPS, ROOT, Inbox, run_on, server_command

STUCK = "tests.fixtures.stuck_server"
PATIENCE_S = 30.0  # a bound on waiting for what must happen, never a measurement


def stuck(tmp_path: Path) -> StdioUpstream:
    command = server_command("--record", str(tmp_path / "runs"), module=STUCK)
    return StdioUpstream("stuck", command, cwd=str(ROOT), era="legacy", backoff_initial=0.1, shutdown_grace=0.5)


async def wait_gone(pid: int) -> bool:
    async with asyncio.timeout(PATIENCE_S):
        while alive(pid):
            await asyncio.sleep(0.05)
    return True


async def ok(up: StdioUpstream) -> str:
    result = await up.request("tools/call", {"name": "ok", "arguments": {}}, timeout=5)
    return str(result["content"][0]["text"])


async def answered_by(up: StdioUpstream, run: str) -> list[str]:
    """Call ``ok`` until the server started as ``run`` answers; what each earlier attempt got."""
    seen: list[str] = []
    async with asyncio.timeout(PATIENCE_S):
        while True:
            try:
                text = await ok(up)
            except (UpstreamUnavailable, UpstreamTimeout) as exc:
                seen.append(type(exc).__name__)
                await asyncio.sleep(0.05)
                continue
            if text == run:
                return seen
            seen.append(text)
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_child_that_closed_its_stdin_is_replaced(loop: str, tmp_path: Path) -> None:
    async def main() -> None:
        up = stuck(tmp_path)
        events: list[tuple[str, str]] = []
        up.watch(lambda event, detail: events.append((event, detail)))
        await up.start(Inbox())
        try:
            assert await ok(up) == "run 1"
            first = up.pid
            assert first is not None
            with pytest.raises((UpstreamTimeout, UpstreamUnavailable)):
                await up.request("tools/call", {"name": "deaf", "arguments": {}}, timeout=0.5)
            await answered_by(up, "run 2")
            assert await wait_gone(first)
            assert ("restarting", "stdin closed while the server runs") in events
        finally:
            await up.close()

    run_on(loop, main)


async def test_restart_replaces_a_frozen_child_and_fails_its_calls(tmp_path: Path) -> None:
    up = stuck(tmp_path)
    events: list[tuple[str, str]] = []
    up.watch(lambda event, detail: events.append((event, detail)))
    await up.start(Inbox())
    try:
        first = up.pid
        assert first is not None
        frozen = asyncio.ensure_future(up.request("tools/call", {"name": "freeze", "arguments": {}}, timeout=60))
        async with asyncio.timeout(PATIENCE_S):
            while True:  # until the server took the call and froze
                try:
                    await up.request("ping", None, timeout=0.5)
                except UpstreamTimeout:
                    break
        assert up.restart("probe failed") is True
        assert up.restart("again") is False  # already being replaced: one restart, not two
        with pytest.raises(UpstreamUnavailable):
            await frozen  # failed at the restart, not at its own 60 s timeout
        await answered_by(up, "run 2")
        assert await wait_gone(first)
        assert events[0] == ("restarting", "unresponsive, restarted: probe failed")
        assert events[-1] == ("connected", "")
    finally:
        await up.close()


async def test_restart_does_nothing_without_a_live_connection(tmp_path: Path) -> None:
    up = stuck(tmp_path)
    assert up.restart("not started") is False
    await up.start(Inbox())
    await up.close()
    assert up.restart("closed") is False
    assert not (tmp_path / "runs").read_text().split()[1:]  # started once, never again


async def test_exits_are_heard_without_pidfds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where pidfds do not exist (not Linux, kernels before 5.3), a thread waits for the child instead."""
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr("os.pidfd_open", no_pidfd)
    up = stuck(tmp_path)
    await up.start(Inbox())
    try:
        first = up.pid
        assert first is not None
        with pytest.raises(UpstreamUnavailable):
            await up.request("tools/call", {"name": "deaf", "arguments": {}}, timeout=PATIENCE_S)
        await answered_by(up, "run 2")  # the stop waited for the exit, which only the thread could report
        assert await wait_gone(first)
    finally:
        await up.close()
