"""``collector.Periodic``: while it runs, no automatic collection, and collections come on its clock; when it is
cancelled, automatic collection is back. ``collector.paused`` inside it leaves it off."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from bastion import collector


async def test_collections_come_on_the_clock_and_automatic_collection_comes_back() -> None:
    assert gc.isenabled()
    generations: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    periodic = collector.Periodic(every_s=0.02, full_every=3)
    gc.callbacks.append(seen)
    task = asyncio.create_task(periodic.run())
    try:
        await asyncio.sleep(0)
        assert not gc.isenabled()
        garbage: list[Any] = []
        for _ in range(20_000):  # far past the allocation count that would start a collection
            cycle: list[Any] = []
            cycle.append(cycle)
            garbage.append(object())
        assert generations == []
        while periodic.collections < 3:
            await asyncio.sleep(0.01)
        assert generations[:3] == [1, 1, 2]
        with collector.paused():
            pass
        assert not gc.isenabled()  # a build inside the serving regime does not turn the allocation counts back on
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gc.callbacks.remove(seen)
    assert gc.isenabled()


def test_a_clock_needs_a_positive_period() -> None:
    with pytest.raises(ValueError):
        collector.Periodic(every_s=0)
