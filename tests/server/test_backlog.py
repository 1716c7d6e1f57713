"""Every queue towards a client is bounded for every producer: past the bound, notifications are coalesced or
dropped and counted; what cannot be dropped is capped where it is made (bastion.backlog, server.emitter)."""

from __future__ import annotations

import asyncio
import itertools
import tracemalloc
from typing import Any

import pytest

from bastion.backlog import CALL_BACKLOG, Outbox
from bastion.errors import INTERNAL_ERROR, RATE_LIMITED, ProtocolError
from bastion.server.emitter import MAX_ASKS_IN_FLIGHT, MAX_ASKS_PER_CALL, StreamEmitter
from bastion.sessions.live import LiveSession


def note(method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def counting() -> tuple[list[tuple[str, str]], Outbox]:
    dropped: list[tuple[str, str]] = []
    return dropped, Outbox(lambda queue, kind: dropped.append((queue, kind)))


async def drain(box: Outbox) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    while len(box):
        out.append(await box.get())
    return out


async def test_a_progress_flood_keeps_the_bound_and_the_latest_value_of_each_token() -> None:
    dropped: dict[tuple[str, str], int] = {}
    box = Outbox(lambda queue, kind: dropped.__setitem__((queue, kind), dropped.get((queue, kind), 0) + 1))
    n = 20_000
    filler = "x" * 2000
    tracemalloc.start()
    try:
        for i in range(1, n + 1):
            box.offer(note("notifications/progress", progressToken="t", progress=i, message=filler))
            assert len(box) <= CALL_BACKLOG
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The queued messages share one filler string: what the queue holds is its slots, not 20,000 messages.
    assert peak < 1_000_000, peak
    assert dropped == {("call", "progress"): n - CALL_BACKLOG}
    got = await drain(box)
    assert len(got) == CALL_BACKLOG
    progress = [m["params"]["progress"] for m in got if m is not None]
    assert progress[-1] == n  # the client still learns how far it got
    assert progress == sorted(progress)


async def test_updates_of_one_uri_and_list_changes_coalesce_other_notifications_drop_with_one_marker() -> None:
    dropped, box = counting()
    for i in range(CALL_BACKLOG - 2):
        box.offer(note("notifications/message", level="info", data=i))
    box.offer(note("notifications/resources/updated", uri="a://x", title="0"))
    box.offer(note("notifications/tools/list_changed"))
    for i in range(1, 1001):
        box.offer(note("notifications/resources/updated", uri="a://x", title=str(i)))
        box.offer(note("notifications/tools/list_changed"))
        box.offer(note("notifications/message", level="info", data=i))
        box.offer(note("notifications/resources/updated", uri=f"a://new{i}"))
    assert len(box) == CALL_BACKLOG + 1  # the bound and one marker
    # Not droppable: a result, and the end.
    box.put_nowait({"jsonrpc": "2.0", "id": 1, "result": {}})
    box.put_nowait(None)
    got = await drain(box)
    assert got[-2] == {"jsonrpc": "2.0", "id": 1, "result": {}} and got[-1] is None
    updates = [m for m in got if m is not None and m.get("method") == "notifications/resources/updated"]
    assert updates == [note("notifications/resources/updated", uri="a://x", title="1000")]
    assert sum(1 for m in got if m is not None and str(m.get("method")).endswith("list_changed")) == 1
    marker = got[-3]
    assert marker is not None and marker["params"]["logger"] == "bastion"
    assert marker["params"]["data"]["dropped"] == {"log": 1000, "resource_updated": 1000}
    assert len(dropped) == 4000
    assert {kind for _, kind in dropped} == {"log", "resource_updated", "list_changed"}


async def test_a_closed_outbox_takes_nothing_frees_what_it_held_and_fails_waiting_requests() -> None:
    _, box = counting()
    for i in range(100):
        box.offer(note("notifications/message", level="info", data=i))
    fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    box.asks = {fut}
    box.close(ProtocolError(INTERNAL_ERROR, "gone"))
    assert len(box) == 0
    assert not box.offer(note("notifications/message", level="info", data="late"))
    box.put_nowait({"jsonrpc": "2.0", "id": 1, "result": {}})
    assert len(box) == 0
    assert await box.get() is None  # a reader waiting on it ends
    with pytest.raises(ProtocolError):
        fut.result()


def emitter() -> tuple[LiveSession, list[tuple[str, str]], StreamEmitter]:
    live = LiveSession("s")
    dropped, box = counting()
    return live, dropped, StreamEmitter(box, live, itertools.count(1))


async def test_requests_to_the_client_are_capped_per_call_and_end_with_it() -> None:
    live, dropped, em = emitter()
    asks = [asyncio.create_task(em.ask("sampling/createMessage", {}, timeout=300.0)) for _ in range(50)]
    await asyncio.sleep(0)
    refused = [t for t in asks if t.done()]
    waiting = [t for t in asks if not t.done()]
    assert len(waiting) == MAX_ASKS_IN_FLIGHT
    assert len(live.pending) == MAX_ASKS_IN_FLIGHT == len(em.outbox)  # only those reached the client's stream
    for task in refused:
        exc = task.exception()
        assert isinstance(exc, ProtocolError) and exc.code == RATE_LIMITED
    assert dropped == [("call", "request")] * (50 - MAX_ASKS_IN_FLIGHT)
    # The call ends: its requests stop waiting now, not after client_request_timeout.
    em.outbox.fail_asks(ProtocolError(INTERNAL_ERROR, "the call ended"))
    await asyncio.sleep(0)
    for task in waiting:
        exc = task.exception()
        assert isinstance(exc, ProtocolError) and exc.code == INTERNAL_ERROR
    assert not live.pending


async def test_a_call_relays_at_most_so_many_requests_in_all() -> None:
    live, _, em = emitter()
    answered = 0
    for _ in range(MAX_ASKS_PER_CALL + 10):
        task = asyncio.create_task(em.ask("elicitation/create", {}, timeout=300.0))
        await asyncio.sleep(0)
        if task.done():
            with pytest.raises(ProtocolError):
                task.result()
            continue
        for fut in list(live.pending.values()):
            fut.set_result({"jsonrpc": "2.0", "result": {"action": "decline"}})
        await task
        answered += 1
    assert answered == MAX_ASKS_PER_CALL
