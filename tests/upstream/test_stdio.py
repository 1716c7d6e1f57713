"""stdio specifics: crash and restart, clean shutdown, stderr into the log, spawn failures."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bastion.errors import UpstreamUnavailable
from bastion.upstream.stdio import StdioUpstream
from tests.upstream.helpers import ROOT, Inbox, server_command


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it counts as gone once reaped, which close() must do.
    return True


async def test_crash_fails_in_flight_then_restarts(tmp_path: Path) -> None:
    inbox = Inbox()
    up = StdioUpstream("basic", server_command(), cwd=str(ROOT), era="legacy")
    await up.start(inbox)
    try:
        first_pid = up.pid
        with capture_logs() as logs, pytest.raises(UpstreamUnavailable) as info:
            await up.request("tools/call", {"name": "crash", "arguments": {}}, timeout=10)
        assert info.value.upstream == "basic"
        assert "basic" in info.value.message
        await inbox.wait_for("notifications/tools/list_changed")
        assert up.pid != first_pid
        result = await up.request("tools/call", {"name": "echo", "arguments": {"message": "back"}}, timeout=10)
        assert result["content"][0]["text"] == "back"
        assert any(e["event"] == "upstream.stderr" and e["line"] == "crashing on request" for e in logs)
    finally:
        await up.close()


async def test_close_shuts_the_child_down() -> None:
    up = StdioUpstream("basic", server_command(), cwd=str(ROOT), era="legacy")
    await up.start(Inbox())
    pid = up.pid
    assert pid is not None
    assert alive(pid)
    await up.close()
    assert not alive(pid)
    with pytest.raises(UpstreamUnavailable):
        await up.request("tools/list", None, timeout=5)


async def test_close_kills_a_server_that_ignores_eof_and_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import json, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "rid = json.loads(sys.stdin.readline())['id']\n"
        'print(\'{"jsonrpc":"2.0","id":\' + str(rid) + \',"result":{"protocolVersion":"2024-11-05","capabilities":{},'
        '"serverInfo":{"name":"stubborn","version":"0"}}}\', flush=True)\n'
        "while True:\n    time.sleep(1)\n")
    up = StdioUpstream("stubborn", [sys.executable, str(script)], shutdown_grace=0.3, era="legacy")
    info = await up.start(Inbox())
    assert info.protocol_version == "2024-11-05"
    pid = up.pid
    assert pid is not None
    async with asyncio.timeout(10):
        await up.close()
    assert not alive(pid)


async def test_unsupported_version_refuses_to_connect(tmp_path: Path) -> None:
    script = tmp_path / "future.py"
    script.write_text(
        "import json, sys\n"
        "rid = json.loads(sys.stdin.readline())['id']\n"
        'print(\'{"jsonrpc":"2.0","id":\' + str(rid) + \',"result":{"protocolVersion":"1999-01-01","capabilities":{},'
        '"serverInfo":{"name":"future","version":"0"}}}\', flush=True)\n'
        "sys.stdin.readline()\n")
    up = StdioUpstream("future", [sys.executable, str(script)], era="legacy")
    with pytest.raises(UpstreamUnavailable) as info:
        await up.start(Inbox())
    assert "1999-01-01" in (info.value.log_detail or "")
    await up.close()


async def test_missing_executable_is_unavailable() -> None:
    up = StdioUpstream("ghost", ["/nonexistent/bastion-test-server"])
    with pytest.raises(UpstreamUnavailable) as info:
        await up.start(Inbox())
    assert "/nonexistent" not in info.value.message
    await up.close()


async def test_child_environment_is_minimal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASTION_TEST_SECRET", "do-not-leak")
    out = tmp_path / "env.txt"
    script = tmp_path / "envdump.py"
    script.write_text(
        "import json, os, sys\n"
        f"open({str(out)!r}, 'w').write(repr(sorted(os.environ.items())))\n"
        "rid = json.loads(sys.stdin.readline())['id']\n"
        'print(\'{"jsonrpc":"2.0","id":\' + str(rid) + \',"result":{"protocolVersion":"2025-06-18","capabilities":{},'
        '"serverInfo":{"name":"env","version":"0"}}}\', flush=True)\n'
        "sys.stdin.read()\n")
    up = StdioUpstream("env", [sys.executable, str(script)], env={"CONFIGURED": "yes"}, era="legacy")
    await up.start(Inbox())
    await up.close()
    dumped = out.read_text()
    assert "do-not-leak" not in dumped
    assert "('CONFIGURED', 'yes')" in dumped
    assert "'PATH'" in dumped


async def test_close_during_a_restart_handshake_still_stops_the_new_child(tmp_path: Path) -> None:
    """Shutdown cancels the restart in its handshake; the child it spawned is stopped, not left running.

    ``close`` cancels the supervisor's task again and again until it ends (``bastion.stopping``); the handshake's
    clean-up (EOF, the grace, SIGTERM) must run to its end through those repeated cancellations.
    """
    pids = tmp_path / "pids"
    script = tmp_path / "flaky.py"
    script.write_text(
        "import json, os, sys, time\n"
        f"pids = {str(pids)!r}\n"
        "first = not os.path.exists(pids)\n"
        "open(pids, 'a').write(f'{os.getpid()}\\n')\n"
        "if not first:\n"
        "    while True:\n        time.sleep(1)  # never answers, never reads stdin: only a signal stops it\n"
        "rid = json.loads(sys.stdin.readline())['id']\n"
        'print(\'{"jsonrpc":"2.0","id":\' + str(rid) + \',"result":{"protocolVersion":"2024-11-05","capabilities":{},'
        '"serverInfo":{"name":"flaky","version":"0"}}}\', flush=True)\n'
        "sys.stdin.readline()\n"  # notifications/initialized, then a crash
    )
    up = StdioUpstream("flaky", [sys.executable, str(script)], shutdown_grace=0.3, backoff_initial=0.01,
                       era="legacy")
    await up.start(Inbox())
    async with asyncio.timeout(10):
        while len(pids.read_text().split()) < 2:
            await asyncio.sleep(0.02)
    restarted = int(pids.read_text().split()[1])
    await asyncio.sleep(0.1)  # well inside the handshake
    async with asyncio.timeout(10):
        await up.close()
    assert not alive(restarted)
