"""An HTTP upstream whose session froze while its connections stay open is restarted, through a real gateway.

The server (``tests.fixtures.frozen_server``) stops answering one session and keeps its TCP connections: the legacy
SSE stream stays open and silent, a Streamable HTTP session's POSTs hang. Health found it ``down`` and nothing ever
left that session: the SSE stream never ended, so the supervisor never reconnected, and every probe of the
Streamable HTTP upstream went to the frozen session again. Now the transport drops the session and opens a new one:
frozen → ``down`` → ``restarting`` → ``up``, and calls work again, answered by the new session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.test_stuck_upstream import call, logged, restarts, text
from tests.faults.test_upstream_health import HEALTH, readyz, state, wait_until
from tests.support.fixture_server import FixtureServer
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient

PATIENCE_S = 60.0  # a bound on waiting for what must happen, never a measurement


@pytest.fixture
def server() -> Iterator[FixtureServer]:
    fixture = FixtureServer("tests.fixtures.frozen_server")
    yield fixture
    fixture.stop()


def gateway(tmp_path: Path, server: FixtureServer, transport: str) -> GatewayProcess:
    url = f"http://127.0.0.1:{server.port}/sse" if transport == "sse" else server.url
    return GatewayProcess({
        "auth": "none",
        "health": {**HEALTH, "probe_timeout": "1s"},
        "upstreams": {"f": {"url": url, "transport": transport, "era": "legacy", "timeout": "2s"}},
    }, tmp_path).start()


@pytest.mark.parametrize("transport", ["sse", "streamable-http"])
def test_a_frozen_session_is_dropped_and_opened_again(transport: str, tmp_path: Path,
                                                       server: FixtureServer) -> None:
    gw = gateway(tmp_path, server, transport)
    rpc = RpcClient(gw.url)
    try:
        rpc.initialize()
        assert text(call(rpc, "f__echo")) == "session 1"
        assert "error" in call(rpc, "f__freeze")  # never answered: the call times out
        wait_until(lambda: text(call(rpc, "f__echo")) == "session 2", PATIENCE_S, "never answered again")
        # Up once a request on the new session or stream was answered, which the echo above or a probe is.
        wait_until(lambda: state(gw, "f") == "up", PATIENCE_S, "never reported up again")
        reasons = [doc["reason"] for doc in logged(gw, "upstream.restart")]
        assert len(reasons) == 1
        assert reasons[0].startswith("health down: probe failed")
        went = [(doc["previous"], doc["state"], doc["reason"]) for doc in logged(gw, "upstream.health")]
        down = next(i for i, (_, new, _) in enumerate(went) if new == "down")
        if transport == "sse":
            # Re-opened by its supervisor, as a stream that ended is: restarting, then up once it answered.
            assert [new for _, new, _ in went[down + 1:]] == ["restarting", "up"]
            assert went[down + 1][2].startswith("unresponsive, restarted: health down: probe failed")
        else:
            # A new session, initialized at once, on trial until a request on it is answered (the frozen
            # session's requests, still out, do not count).
            assert [(new, reason) for _, new, reason in went[down + 1:]] == \
                [("restarting", "reconnected, waiting for an answer"), ("up", "answering")]
        assert restarts(gw) == 1
    finally:
        rpc.close()
        gw.stop()


@pytest.mark.parametrize("transport", ["sse", "streamable-http"])
def test_a_server_that_freezes_every_session_it_opens_is_never_reported_up(transport: str, tmp_path: Path,
                                                                           server: FixtureServer) -> None:
    # It answers each new session's handshake and nothing after. Each restart used to make it ``up`` on that
    # handshake alone: the Streamable HTTP upstream was up or degraded (ready, bastion_upstream_up 1) all the
    # time, its frozen session renewed every few seconds without a pause, and no call ever succeeded.
    gw = gateway(tmp_path, server, transport)
    rpc = RpcClient(gw.url)
    try:
        rpc.initialize()
        assert text(call(rpc, "f__echo")) == "session 1"
        assert "error" in call(rpc, "f__freeze_all")
        wait_until(lambda: len(logged(gw, "upstream.restart")) >= 3, PATIENCE_S, "not restarted three times")
        went = [(doc["state"], doc["reason"]) for doc in logged(gw, "upstream.health")]
        down = next(i for i, (new, _) in enumerate(went) if new == "down")
        assert not [new for new, _ in went[down:] if new in ("up", "degraded")], went
        if transport == "streamable-http":
            # (A supervised transport is restarting already: its reconnection changes no state.)
            assert ("restarting", "reconnected, waiting for an answer") in went[down:]
        assert state(gw, "f") in ("down", "restarting")
        assert readyz(gw)[0] == 503
        # Its tools left the lists once (hide_after: 1 s) and did not come back at each restart.
        assert [doc["upstreams"] for doc in logged(gw, "catalogue.upstreams_hidden")] == [["f"]]
        # Each restart waits longer than the one before: a crash loop's backoff.
        waits = [doc["seconds"] for doc in logged(gw, "upstream.reconnect_wait")]
        assert waits[:2] == sorted(waits[:2]) and len(waits) >= 2
    finally:
        rpc.close()
        gw.stop()
