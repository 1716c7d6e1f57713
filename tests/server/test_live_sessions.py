"""Live per-session state is forgotten once idle, unless something still runs on it."""

from __future__ import annotations

import asyncio

from bastion.backlog import Outbox
from bastion.sessions.live import InflightCall, LiveSessions


async def test_idle_sessions_are_swept_and_busy_ones_kept() -> None:
    live = LiveSessions(idle_timeout_s=0.0, sweep_every_s=0.0)
    idle = live.get("idle")
    busy = live.get("busy")
    busy.get_stream = Outbox()
    assert idle is not busy
    live.get("trigger")  # any access sweeps once the interval has passed
    ids = {s.id for s in live.all()}
    assert "idle" not in ids
    assert "busy" in ids


async def test_drop_cancels_what_runs_and_wakes_the_stream() -> None:
    live = LiveSessions()
    session = live.get("s")
    task = asyncio.create_task(asyncio.sleep(10))
    session.inflight[1] = call = InflightCall(task)
    session.get_stream = queue = Outbox()
    live.drop("s")
    await asyncio.sleep(0)
    assert task.cancelled() and call.by_client
    assert await queue.get() is None
    assert live.all() == []


async def test_the_memory_store_reports_expired_sessions_once() -> None:
    from bastion.sessions.store import MemorySessionStore, SessionData

    expired: list[str] = []
    store = MemorySessionStore(idle_timeout_s=0.0, max_sessions=10, on_expired=lambda d: expired.append(d.id),
                               sweep_every_s=0.0)
    await store.create(SessionData(id="a", principal_id="p", protocol_version="2025-11-25"))
    await store.create(SessionData(id="b", principal_id="p", protocol_version="2025-11-25"))
    assert await store.get("a") is None
    assert await store.get("b") is None
    assert sorted(expired) == ["a", "b"]
    assert await store.delete("a") is False
    assert await store.count() == 0


async def test_end_closes_the_stream_and_stops_subscriptions_but_lets_running_calls_finish() -> None:
    live = LiveSessions()
    session = live.get("s")
    task = asyncio.create_task(asyncio.sleep(10))
    session.inflight[1] = call = InflightCall(task)
    session.pending[7] = asked = asyncio.get_running_loop().create_future()
    session.get_stream = queue = Outbox()
    session.subscriptions.add("basic+mem://a")
    session.log_level = "debug"
    live.end("s")
    await asyncio.sleep(0)
    assert await queue.get() is None
    assert not session.subscriptions and session.log_level is None
    assert asked.cancelled()
    assert not task.cancelled() and not call.by_client  # authorised when it started, bounded by its timeout
    assert live.all() == []  # no sender finds it any more
    task.cancel()


async def test_memory_peek_does_not_keep_a_session_alive() -> None:
    from bastion.sessions.store import MemorySessionStore, SessionData

    store = MemorySessionStore(idle_timeout_s=0.1, max_sessions=10)
    await store.create(SessionData(id="a", principal_id="p", protocol_version="2025-11-25"))
    assert await store.peek("a") is not None
    await asyncio.sleep(0.15)
    assert await store.peek("a") is None
