"""Requests an upstream sends bastion are bounded per connection, their answers cannot pile up in a pipe nobody
reads, and the warnings each one can cause are rate-limited (upstream.session, upstream.stdio)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from bastion.errors import INVALID_REQUEST, RATE_LIMITED, UpstreamUnavailable
from bastion.upstream.lines import PIPE_LIMIT
from bastion.upstream.session import MAX_SERVING, REFUSAL_REASONS, RpcSession, ServerRequests
from bastion.upstream.stdio import STDIN_HIGH_WATER, StdioUpstream
from tests.upstream.helpers import ROOT, Inbox, server_command

NOISY = ("upstream.answer_failed", "upstream.server_request_refused")


def flood(*args: str) -> list[str]:
    return server_command(*args, module="tests.fixtures.flood_server")


async def test_one_connection_serves_at_most_so_many_requests_and_refuses_the_rest_at_once() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    rpc = RpcSession("flood", send)
    for i in range(5000):
        await rpc.handle({"jsonrpc": "2.0", "id": i, "method": "ping"})
        assert len(rpc._serving) <= MAX_SERVING
    await rpc.handle({"jsonrpc": "2.0", "id": 0, "method": "ping"})  # an id still being served
    refused = [m for m in sent if "error" in m]
    assert len(refused) == 5000 - MAX_SERVING + 1
    assert {m["error"]["code"] for m in refused[:-1]} == {RATE_LIMITED}
    assert refused[-1]["id"] == 0 and refused[-1]["error"]["code"] == INVALID_REQUEST
    await asyncio.gather(*rpc._serving.values())
    assert sorted(m["id"] for m in sent if "result" in m) == list(range(MAX_SERVING))
    await rpc.aclose()


async def test_undeliverable_answers_are_logged_sparingly() -> None:
    async def send(message: dict[str, Any]) -> None:
        raise UpstreamUnavailable("flood", log_detail="stdin not being read")

    rpc = RpcSession("flood", send)
    with capture_logs() as logs:
        for i in range(5000):
            await rpc.handle({"jsonrpc": "2.0", "id": i, "method": "ping"})
        await asyncio.gather(*rpc._serving.values())
    noisy = [e for e in logs if e["event"] in NOISY]
    # 5000 refusals and 5000 failed answers: a burst of 20, then about one a second.
    assert len(noisy) < 60, len(noisy)
    assert rpc.noisy._suppressed > 0  # counted, for the next line logged
    await rpc.aclose()


async def test_writes_to_a_child_that_stopped_reading_stop_at_the_high_water_mark() -> None:
    up = StdioUpstream("deaf", flood("--deaf"), cwd=str(ROOT), era="legacy")
    await up.start(Inbox())
    try:
        message = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * (1 << 20)}}
        refused: list[str] = []
        for _ in range(3 * STDIN_HIGH_WATER // (1 << 20)):
            try:
                # Written at once; only the wait for the pipe to take it is cut short.
                async with asyncio.timeout(0.01):
                    await up._write(message)
            except TimeoutError:
                pass
            except UpstreamUnavailable as exc:
                refused.append(exc.log_detail or "")
        assert up._proc is not None
        proc = up._proc
        assert proc.stdin is not None
        assert proc.stdin.transport.get_write_buffer_size() <= STDIN_HIGH_WATER + (1 << 20) + 100
        assert refused and all("stdin not being read" in detail for detail in refused)
    finally:
        await up.close()


async def test_a_ping_flood_from_a_child_that_does_not_read_stays_bounded() -> None:
    up = StdioUpstream("flood", flood("--pingflood", "50000"), cwd=str(ROOT), era="legacy")
    await up.start(Inbox())
    try:
        with capture_logs() as logs:
            await up.request("tools/list", None, timeout=10)  # the child stops reading and floods
            rpc = up._rpc
            most_served = most_buffered = 0
            for _ in range(300):
                await asyncio.sleep(0.01)
                most_served = max(most_served, len(rpc._serving))
                proc = up._proc if up._proc is not None else None
                if proc is not None and proc.stdin is not None:
                    most_buffered = max(most_buffered, proc.stdin.transport.get_write_buffer_size())
        assert most_served <= MAX_SERVING
        assert most_buffered <= STDIN_HIGH_WATER
        assert len([e for e in logs if e["event"] in NOISY]) < 60
    finally:
        await up.close()


@pytest.mark.parametrize("rid", ["dup", 7])
async def test_a_request_reusing_an_id_in_service_is_refused(rid: Any) -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    rpc = RpcSession("flood", send)
    await rpc.handle({"jsonrpc": "2.0", "id": rid, "method": "ping"})
    await rpc.handle({"jsonrpc": "2.0", "id": rid, "method": "ping"})
    assert len(rpc._serving) == 1
    await asyncio.gather(*rpc._serving.values())
    assert [("error" in m) for m in sent] == [True, False]
    await rpc.aclose()


async def test_every_refusal_is_reported_with_its_reason_and_the_bound_is_the_connections_own() -> None:
    """``max_server_requests`` bounds the connection, and every refusal (not only those the rate-limited log shows)
    reaches ``on_refused`` with a reason from a closed set, whatever the upstream sent."""
    sent: list[dict[str, Any]] = []
    refused: list[tuple[str, str]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    rpc = RpcSession("flood", send, server_requests=ServerRequests(
        max_serving=3, on_refused=lambda upstream, reason: refused.append((upstream, reason))))
    for i in range(500):
        await rpc.handle({"jsonrpc": "2.0", "id": i, "method": "ping"})
        assert len(rpc._serving) <= 3
    await rpc.handle({"jsonrpc": "2.0", "id": 0, "method": "ping"})  # an id still being served
    await asyncio.gather(*rpc._serving.values())
    # Outside any call: nobody to relay a sampling request to.
    await rpc.handle({"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage", "params": {}})
    await asyncio.gather(*rpc._serving.values())
    rpc.accept_server_requests = False  # a 2026-07-28 server may send none
    await rpc.handle({"jsonrpc": "2.0", "id": "s2", "method": "elicitation/create", "params": {}})
    await asyncio.gather(*rpc._serving.values())
    counts: dict[str, int] = {}
    for upstream, reason in refused:
        assert upstream == "flood" and reason in REFUSAL_REASONS
        counts[reason] = counts.get(reason, 0) + 1
    assert counts == {"too_many": 497, "duplicate_id": 1, "no_call": 1, "not_accepted": 1}
    assert len([m for m in sent if "error" in m]) == 500
    await rpc.aclose()


async def test_a_flood_on_a_childs_stdout_waits_in_the_pipe_not_in_bastion() -> None:
    """200000 pings (about 10 MB) from a child that stops reading: bastion reads ahead at most about twice the
    pipe reader's small limit, not the whole flood (up to twice max_message_size, 128 MiB, it used to)."""
    up = StdioUpstream("flood", flood("--pingflood", "200000"), cwd=str(ROOT), era="legacy")
    await up.start(Inbox())
    try:
        with capture_logs():
            await up.request("tools/list", None, timeout=10)
            most = 0
            for _ in range(300):
                await asyncio.sleep(0.01)
                child = up._proc
                stdout = child.stdout if child is not None else None
                if stdout is not None:
                    most = max(most, len(stdout._buffer))  # type: ignore[attr-defined]
        # Paused past 2 * PIPE_LIMIT; one read of the pipe (at most 256 KiB) may land before the pause.
        assert 0 < most <= 2 * PIPE_LIMIT + 256 * 1024, most
    finally:
        await up.close()
