"""Background tasks stop at shutdown even when code inside them drops a cancellation (bastion.stopping).

The drop is produced the way it happens in production, not imitated: ``asyncio.wait_for`` (as redis-py awaits a
socket write) whose inner await finishes in the same loop iteration as the cancellation arrives. On Python 3.11 it
returns the result and the cancellation is gone (CPython gh-86296): the sweeper and lease tests below fail there
without the fixes. A task that swallows cancellations by hand tests the repeated request on any Python.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from bastion.ratelimit.limiter import CapCheck
from bastion.ratelimit.memory import MemoryLimiter
from bastion.sessions.store import MemorySessionStore, SessionData
from bastion.sessions.sweep import SessionSweeper
from bastion.stopping import cancel_and_wait, finish


class Gate:
    """An await inside a library call that the test finishes exactly when it cancels the task awaiting it."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self._inner: asyncio.Future[None] | None = None
        self.passes = 0

    async def through(self) -> None:
        self._inner = asyncio.get_running_loop().create_future()
        self.entered.set()
        await asyncio.wait_for(self._inner, 30)  # what redis-py does around a socket write
        self.passes += 1

    def finish(self) -> None:
        """Finish the inner await; the caller cancels the awaiting task before the loop runs again."""
        assert self._inner is not None
        self.entered.clear()
        self._inner.set_result(None)


async def _loop_through(gate: Gate) -> None:
    while True:
        await gate.through()
        await asyncio.sleep(0.001)


async def test_a_task_that_dropped_its_cancellation_is_stopped() -> None:
    gate = Gate()
    task = asyncio.create_task(_loop_through(gate))
    await gate.entered.wait()
    gate.finish()
    async with asyncio.timeout(5):
        await cancel_and_wait([task])
    assert task.done()


async def test_a_task_that_swallows_cancellations_by_hand_is_asked_until_it_stops() -> None:
    asked = 0

    async def stubborn() -> None:
        nonlocal asked
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                asked += 1
                if asked == 3:
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await cancel_and_wait([task])
    assert task.cancelled() and asked == 3


async def test_failures_on_the_way_out_are_retrieved_and_finished_tasks_are_left_alone() -> None:
    unhandled: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))

    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def finished() -> int:
        return 1

    failing = asyncio.create_task(fails_when_cancelled())
    done = asyncio.create_task(finished())
    await asyncio.sleep(0)
    await cancel_and_wait([failing, done])
    assert isinstance(failing.exception(), RuntimeError)
    assert done.result() == 1
    del failing, done
    import gc
    gc.collect()
    assert unhandled == []


async def cleans_up_when_cancelled(cleanup: Callable[[], Awaitable[None]]) -> None:
    """Wait to be cancelled, then run ``cleanup`` through ``finish``, as a stdio handshake stops its child."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        await finish(cleanup())
        raise


async def test_a_cleanup_through_finish_runs_to_its_end_however_often_the_task_is_cancelled() -> None:
    steps: list[str] = []

    async def cleanup() -> None:
        for step in ("eof", "grace", "sigterm"):
            await asyncio.sleep(0.25)  # each step longer than the helper's interval between requests
            steps.append(step)

    task = asyncio.create_task(cleans_up_when_cancelled(cleanup))
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await cancel_and_wait([task])
    assert steps == ["eof", "grace", "sigterm"]
    assert task.cancelled()


async def test_a_cleanup_that_fails_while_the_task_is_cancelled_leaves_no_unretrieved_exception() -> None:
    unhandled: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))

    async def cleanup() -> None:
        await asyncio.sleep(0.05)
        raise OSError("the child was already gone")

    task = asyncio.create_task(cleans_up_when_cancelled(cleanup))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0.01)
    task.cancel()  # a second request while the cleanup runs: the task now reports the cancellation
    await cancel_and_wait([task])
    assert task.cancelled()
    del task  # its cancellation's traceback holds the cleanup's task
    import gc
    gc.collect()
    await asyncio.sleep(0)
    assert unhandled == []


async def test_finish_returns_the_result_when_nothing_cancels() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert await finish(answer()) == 42


async def test_the_calling_task_is_not_waited_for() -> None:
    me = asyncio.current_task()
    assert me is not None
    async with asyncio.timeout(5):
        await cancel_and_wait([me])
    assert not me.cancelled() and me.cancelling() == 0


class _RacingStore(MemorySessionStore):
    """An in-memory store whose sweep awaits like a Redis round trip."""

    def __init__(self) -> None:
        super().__init__(idle_timeout_s=60, max_sessions=10)
        self.gate = Gate()

    async def sweep(self) -> int:
        await self.gate.through()
        return await super().sweep()


async def test_the_session_sweeper_closes_though_its_sweep_dropped_the_cancellation() -> None:
    store = _RacingStore()
    counts: list[int] = []

    async def on_shutdown(data: SessionData) -> None:
        raise AssertionError("nothing to end")

    sweeper = SessionSweeper(store, 0.001, on_count=counts.append, on_shutdown=on_shutdown)
    sweeper.start()
    await store.gate.entered.wait()
    store.gate.finish()
    # Not ``await sweeper.close()`` under a timeout: the timeout's cancellation would reach the sweeper's task
    # through the await and stop it, hiding the hang this test is about.
    closing = asyncio.ensure_future(sweeper.close())
    done, _ = await asyncio.wait({closing}, timeout=5)
    assert done, "close() hangs"
    passes = store.gate.passes
    await asyncio.sleep(0.05)
    assert store.gate.passes == passes  # no sweep after close


class _RacingLimiter(MemoryLimiter):
    def __init__(self) -> None:
        super().__init__(lease_ttl_s=0.006)  # a beat every 2 ms
        self.gate = Gate()
        self.renewals = 0

    async def _renew(self, caps: Sequence[CapCheck], lease_id: str) -> None:
        self.renewals += 1
        await self.gate.through()


async def test_a_released_lease_is_not_renewed_though_its_heartbeat_dropped_the_cancellation() -> None:
    limiter = _RacingLimiter()
    caps = [CapCheck("cap", "k", 1)]
    lease = limiter.lease(caps)
    async with lease:
        heartbeat = lease._heartbeat
        assert heartbeat is not None
        await limiter.gate.entered.wait()
        limiter.gate.finish()
    # __aexit__ cancelled the heartbeat in the same iteration as its renewal finished.
    done, _ = await asyncio.wait({heartbeat}, timeout=5)
    assert done
    renewals = limiter.renewals
    await asyncio.sleep(0.05)
    assert limiter.renewals == renewals
    assert limiter.in_flight("k") == 0
