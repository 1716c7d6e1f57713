"""Shutting the core down: every background task the pool started ends when it is closed, whatever it was doing.

The regression this guards: with ``asyncio.wait_for`` (now banned in src/ by ruff's TID251), Python 3.11 swallowed
a cancellation that arrived after the awaited event fired but before wait_for resumed (CPython gh-86296), so the
health watcher looped on and ``close()``, hence the app's shutdown, never returned."""

from __future__ import annotations

import asyncio

from bastion.errors import UpstreamUnavailable
from bastion.health import HealthConfig, HealthMonitor


async def test_closing_the_health_monitor_right_after_a_failure_returns() -> None:
    monitor = HealthMonitor(["notes"], HealthConfig())

    async def probe(name: str, timeout: float) -> bool:
        raise UpstreamUnavailable(name)

    monitor.probe = probe
    monitor.connected("notes")
    monitor.start()
    await asyncio.sleep(0.01)  # the watcher now waits for its wake-up event
    monitor.failed("notes", "a call found it unreachable")  # sets the event: the watcher resumes next iteration
    closing = asyncio.create_task(monitor.close())  # scheduled after that wake-up, in the same iteration
    done, _ = await asyncio.wait([closing], timeout=0.5)
    if not done:
        # The first cancellation was lost; a second one, at a clean point, ends the watcher so nothing leaks.
        await monitor.close()
        await closing
    assert done, "HealthMonitor.close() did not return"
