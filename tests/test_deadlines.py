"""``Deadlines``: asyncio.timeout's behaviour (expiry, cancellation from outside, nesting) on one timer per
component, under asyncio's loop and uvloop (the gateway's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from bastion.deadlines import Deadlines

Main = Callable[[], Coroutine[Any, Any, None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Main], None]:
    def runner(main: Main) -> None:
        if request.param == "uvloop":
            uvloop.run(main())
        else:
            asyncio.run(main())
    return runner


def test_a_block_past_its_deadline_raises_timeout_error(run: Callable[[Main], None]) -> None:
    async def main() -> None:
        deadlines = Deadlines()
        started = time.monotonic()
        with pytest.raises(TimeoutError), deadlines.after(0.05) as block:
            await asyncio.sleep(10)
        assert block.expired()
        assert 0.04 <= time.monotonic() - started < 5
        assert len(deadlines) == 0
        # The task is not left cancelled: it goes on awaiting.
        await asyncio.sleep(0.01)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
    run(main)


def test_a_block_that_ends_in_time_is_left_alone_and_dropped(run: Callable[[Main], None]) -> None:
    async def main() -> None:
        deadlines = Deadlines()
        for _ in range(1000):
            with deadlines.after(30) as block:
                await asyncio.sleep(0)
            assert not block.expired()
        # Finished blocks are dropped in bulk: the heap never holds much more than twice what is in flight.
        assert len(deadlines) <= 2 * 64 + 2
    run(main)


def test_a_cancellation_from_outside_stays_a_cancellation(run: Callable[[Main], None]) -> None:
    async def main() -> None:
        deadlines = Deadlines()
        entered = asyncio.Event()

        async def victim() -> None:
            with deadlines.after(30):
                entered.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(victim())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    run(main)


def test_an_outside_cancellation_that_meets_the_expiry_wins(run: Callable[[Main], None]) -> None:
    async def main() -> None:
        deadlines = Deadlines()

        async def victim() -> None:
            task = asyncio.current_task()
            assert task is not None
            with deadlines.after(0.05):
                # Someone else cancels the task just after the deadline; both timers are due once the task stops
                # holding the loop, so both cancellations are requested before it resumes.
                asyncio.get_running_loop().call_later(0.06, task.cancel)
                time.sleep(0.1)
                await asyncio.sleep(10)

        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(victim())
    run(main)


def test_nested_blocks_each_own_their_expiry(run: Callable[[Main], None]) -> None:
    async def main() -> None:
        deadlines = Deadlines()
        # The inner one expires first: it raises, the outer block goes on.
        with deadlines.after(30) as outer:
            with pytest.raises(TimeoutError), deadlines.after(0.05):
                await asyncio.sleep(10)
            await asyncio.sleep(0)
        assert not outer.expired()
        # The outer one expires first: the inner block lets the cancellation through, the outer one converts it.
        inner_left_by: list[type[BaseException]] = []

        async def outer_first() -> None:
            with deadlines.after(0.05):
                try:
                    with deadlines.after(30):
                        await asyncio.sleep(10)
                except BaseException as exc:
                    inner_left_by.append(type(exc))
                    raise

        with pytest.raises(TimeoutError):
            await outer_first()
        assert inner_left_by == [asyncio.CancelledError]
    run(main)


def test_a_later_block_with_an_earlier_deadline_expires_first(run: Callable[[Main], None]) -> None:
    async def main() -> None:
        deadlines = Deadlines()
        order: list[str] = []

        async def timed(name: str, delay: float) -> None:
            try:
                with deadlines.after(delay):
                    await asyncio.sleep(10)
            except TimeoutError:
                order.append(name)

        slow = asyncio.create_task(timed("slow", 0.3))
        await asyncio.sleep(0)
        fast = asyncio.create_task(timed("fast", 0.05))
        started = time.monotonic()
        await fast
        assert order == ["fast"] and time.monotonic() - started < 0.25
        await slow
        assert order == ["fast", "slow"]
    run(main)


def test_many_tasks_expire_together_and_the_survivors_do_not(run: Callable[[Main], None]) -> None:
    async def main() -> None:
        deadlines = Deadlines()

        async def timed(delay: float, work: float) -> str:
            try:
                with deadlines.after(delay):
                    await asyncio.sleep(work)
            except TimeoutError:
                return "timeout"
            return "done"

        results = await asyncio.gather(*(timed(0.05, 10) for _ in range(50)), *(timed(10, 0.01) for _ in range(50)))
        assert results == ["timeout"] * 50 + ["done"] * 50
    run(main)


def test_no_deadline_never_expires(run: Callable[[Main], None]) -> None:
    async def main() -> None:
        deadlines = Deadlines()
        with deadlines.after(None) as block:
            await asyncio.sleep(0.05)
        assert not block.expired() and len(deadlines) == 0
    run(main)


def test_a_deadline_outside_a_task_is_refused() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines()
        done: asyncio.Future[BaseException] = loop.create_future()

        def in_callback() -> None:
            try:
                deadlines.after(1)
            except RuntimeError as exc:
                done.set_result(exc)

        loop.call_soon(in_callback)
        assert "inside a task" in str(await done)
    asyncio.run(main())


def test_one_component_serves_one_loop_after_another() -> None:
    deadlines = Deadlines()

    async def main() -> None:
        with pytest.raises(TimeoutError), deadlines.after(0.05):
            await asyncio.sleep(10)
        with deadlines.after(30):  # left armed for 30 s when this loop closes
            await asyncio.sleep(0)

    asyncio.run(main())
    uvloop.run(main())  # the second loop's deadline fires although the first loop's timer went with it
    asyncio.run(main())


def test_a_timer_left_on_an_earlier_loop_does_nothing_when_that_loop_runs_again() -> None:
    deadlines = Deadlines()
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        async def short() -> None:
            with deadlines.after(0.05):  # arms a timer on the first loop, for 50 ms from now
                await asyncio.sleep(0)

        first.run_until_complete(short())
        release = second.create_future()

        async def held() -> bool:
            with deadlines.after(30) as block:  # rebinds to the second loop
                await release
            return block.expired()

        task = second.create_task(held())
        second.run_until_complete(asyncio.sleep(0.01))
        timer = deadlines._timer
        first.run_until_complete(asyncio.sleep(0.1))  # the first loop's timer fires now
        assert deadlines._timer is timer and len(deadlines) == 1  # the second loop's timer and heap untouched
        release.set_result(None)
        assert second.run_until_complete(task) is False
    finally:
        first.close()
        second.close()
