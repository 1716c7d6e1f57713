"""A failed re-handshake is one failed attempt, never the end: the upstream comes back once its server answers.

Nothing restarts a transport the gateway holds as connected, so each transport must keep trying by itself. A
server that restarts (a crashed stdio child, an HTTP server that lost our session) and then answers its first
``initialize`` with a JSON-RPC error, or not at all, is served again as soon as a later handshake succeeds:
- stdio (and HTTP+SSE, through the same ``Supervisor``): the reconnect loop goes on after the failed attempt;
- Streamable HTTP: the session lost in the failed re-initialization is initialized again by the next request,
  rather than every later request being sent without a session (refused with 400 by the server, forever).

The fixture (``tests.fixtures.flaky_server``) numbers its starts; ``--fail-runs 2`` makes the second
start's first handshake fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion.errors import RequestError, UpstreamRpcError, UpstreamTimeout, UpstreamUnavailable
from bastion.upstream.http import HttpUpstream
from bastion.upstream.stdio import StdioUpstream
from tests.upstream.helpers import ROOT, HttpServer, Inbox, server_command

FLAKY = "tests.fixtures.flaky_server"
# How long a test waits for the upstream to come back: many reconnect attempts, never a measurement.
RECOVERY_S = 30.0


async def echo(up: Any, timeout: float = 10) -> str:
    result = await up.request("tools/call", {"name": "echo", "arguments": {}}, timeout=timeout)
    return str(result["content"][0]["text"])


async def echo_once_back(up: StdioUpstream, inbox: Inbox) -> str:
    """The answer of the first call after the restart announced itself (``tools/list_changed``)."""
    await inbox.wait_for("notifications/tools/list_changed", timeout=RECOVERY_S)
    return await echo(up)


@pytest.mark.parametrize("hang", [False, True], ids=["error", "no-answer"])
async def test_stdio_restart_whose_handshake_fails_is_retried(tmp_path: Path, hang: bool) -> None:
    runs = tmp_path / "runs"
    command = server_command("--transport", "stdio", "--record", str(runs), "--fail-runs", "2",
                             *(["--hang"] if hang else []), module=FLAKY)
    inbox = Inbox()
    # A short handshake deadline, so the unanswered one fails (UpstreamTimeout) soon.
    up = StdioUpstream("flaky", command, cwd=str(ROOT), era="legacy", init_timeout=2.0, backoff_initial=0.1)
    await up.start(inbox)
    try:
        assert await echo(up) == "run 1"
        with pytest.raises(UpstreamUnavailable):
            await up.request("tools/call", {"name": "crash", "arguments": {}}, timeout=10)
        # Run 2 fails its handshake; run 3 is the server back.
        assert await echo_once_back(up, inbox) == "run 3"
        assert runs.read_text().split() == ["1", "2", "3"]
    finally:
        await up.close()


@pytest.fixture
def flaky_http(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[HttpServer]:
    extra = ("--fail-runs", "2", *(("--hang",) if request.param else ()))
    server = HttpServer("streamable-http", tmp_path / "runs", extra=extra, module=FLAKY).start()
    yield server
    server.stop()


@pytest.mark.parametrize("flaky_http", [False, True], ids=["error", "no-answer"], indirect=True)
async def test_http_session_lost_in_a_failed_reinitialize_is_initialized_again(flaky_http: HttpServer) -> None:
    inbox = Inbox()
    async with httpx.AsyncClient() as client:
        up = HttpUpstream("flaky", flaky_http.base + "/mcp", {}, client, init_timeout=2.0)
        await up.start(inbox)
        try:
            assert await echo(up) == "run 1 session r1-1"
            flaky_http.restart()  # run 2: forgets our session, fails its first initialize
            with pytest.raises(RequestError) as failed:
                await echo(up)
            assert isinstance(failed.value, UpstreamTimeout if flaky_http.extra[-1] == "--hang" else UpstreamRpcError)
            # The server is fine now: the next request initializes a new session before it is sent.
            assert await echo(up) == "run 2 session r2-1"
            assert await echo(up) == "run 2 session r2-1"
            await inbox.wait_for("notifications/tools/list_changed")
        finally:
            await up.close()
