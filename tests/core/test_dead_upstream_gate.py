"""A dead upstream's calls fail fast with -31002, whatever its refresh gate is doing, in process.

The hostile-client review's case: a call is in flight when the upstream starts shutting down; it finishes that
call (uvicorn does on SIGTERM) while refusing new connections, so the gateway sees new calls fail, declares the
upstream ``down``, and only then gets the late answer. That answer must not bring the upstream back ``up``
(its lists would be fetched again and its refresh gate closed for a refresh that cannot succeed), and a gate
closed for any reason must not hold calls for an upstream that cannot answer them: they fail at once with
-31002, never after ``catalogue.gate_timeout`` with -31010's "list again and retry".

Over ``tests.core.build.running_core``: the real pool, health monitor, gate, pipeline and dispatcher, and a
``MemoryUpstream`` whose ``reachable = False`` refuses new requests while the ones already inside finish.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from bastion import upstream_pool
from bastion.errors import UpstreamUnavailable
from bastion.health import Health
from bastion.upstream.base import RelatedMessageHandler
from tests.audit.helpers import assert_valid
from tests.core.build import Core, running_core
from tests.support.memory_upstream import MemoryUpstream, text_result, tool

# Probes only while unwell (the healthy interval is an hour), quickly; hide_after far away unless a test says.
HEALTH = {"probe_interval": "1h", "recovery_interval": "50ms", "probe_jitter": 0.0, "probe_timeout": "1s",
          "failures_to_down": 2, "hide_after": "1h"}
GATE_TIMEOUT_S = 2.0


class Held:
    """The ``wait`` tool: each call waits until released, so a test decides when the answer arrives."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, params: dict[str, Any], on_message: RelatedMessageHandler | None) -> dict[str, Any]:
        self.entered.set()
        await self.release.wait()
        return text_result("finished")


@pytest.fixture
async def slow() -> AsyncIterator[tuple[Core, MemoryUpstream, Held]]:
    up = MemoryUpstream("slow", tools=[tool("wait"), tool("echo")])
    held = Held()
    up.script("tools/call", "wait", handler=held)
    async with running_core(up, health=HEALTH, catalogue={"gate_timeout": f"{GATE_TIMEOUT_S}s"}) as core:
        yield core, up, held


async def until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def call_fails_fast_as_unavailable(core: Core, tool_name: str) -> dict[str, Any]:
    """Call ``tool_name``; it must fail with -31002 well inside the gate timeout. Returns its audit record."""
    before = len(core.records())
    started = time.monotonic()
    with pytest.raises(UpstreamUnavailable) as info:
        await core.rpc("tools/call", {"name": tool_name, "arguments": {}})
    elapsed = time.monotonic() - started
    assert info.value.code == -31002
    assert elapsed < GATE_TIMEOUT_S / 4, f"waited {elapsed:.2f}s: the refresh gate held a call to a dead upstream"
    records = core.records()
    assert len(records) == before + 1
    assert_valid(records[-1])
    assert records[-1]["outcome"] == "upstream_unavailable"
    return records[-1]


async def test_a_late_answer_after_the_upstream_died_leaves_it_down_and_its_calls_fail_fast(
        slow: tuple[Core, MemoryUpstream, Held]) -> None:
    core, up, held = slow
    monitor, gate = core.pool.monitor, core.pool.gate
    # 1. A call is in flight.
    in_flight = asyncio.create_task(core.rpc("tools/call", {"name": "slow__wait", "arguments": {}}))
    await asyncio.wait_for(held.entered.wait(), 5)
    # 2. The upstream shuts down: new requests are refused, the one inside goes on.
    up.reachable = False
    # 3. Another call fails; the probe it starts confirms: down.
    with pytest.raises(UpstreamUnavailable):
        await core.rpc("tools/call", {"name": "slow__echo", "arguments": {}})
    await until(lambda: monitor.status("slow").state == "down")
    states: list[str] = []
    report = monitor.on_transition

    def recording(name: str, old: Health, new: Health) -> None:
        states.append(new.state)
        report(name, old, new)

    monitor.on_transition = recording
    # 4. The in-flight call's answer arrives, late.
    held.release.set()
    assert (await in_flight)["content"][0]["text"] == "finished"
    await asyncio.sleep(0.2)  # several probe rounds and a refresh debounce, had anything been started
    # Calls fail fast, at the forward, as a down upstream's calls do.
    record = await call_fails_fast_as_unavailable(core, "slow__echo")
    assert record["stage"] == "forward"
    # It answered a request sent before the failure: that says nothing about now. It stayed down all along (what
    # /readyz and the metrics report), so nothing re-fetched its lists or closed its gate.
    assert states == []
    assert monitor.snapshot()["slow"]["state"] == "down"
    assert not core.pool.is_up("slow")
    assert not gate.is_closed("slow")
    # It comes back: the probe (sent after the failures) brings it up, and calls work again.
    up.reachable = True
    await until(lambda: monitor.status("slow").state == "up")
    await until(lambda: not gate.is_closed("slow"))
    result = await core.rpc("tools/call", {"name": "slow__echo", "arguments": {"x": 1}})
    assert result["content"][0]["text"] == '{"x": 1}'


async def test_a_gate_closed_when_the_upstream_dies_does_not_hold_its_calls(
        slow: tuple[Core, MemoryUpstream, Held], monkeypatch: pytest.MonkeyPatch) -> None:
    core, up, _ = slow
    monitor, gate = core.pool.monitor, core.pool.gate
    monkeypatch.setattr(upstream_pool, "_GATED_RETRY_S", 0.05)  # retry the failing refresh often: churn shows
    # The upstream announces a tools change, then dies before the refresh can fetch the new list.
    up.reachable = False
    await up.announce("notifications/tools/list_changed")
    assert gate.is_closed("slow")
    # The refresh fails at the transport: the gate stays closed (nothing unchecked is forwarded), but nobody
    # waits for it; the call is refused at the gate, at once, as unavailable.
    await until(lambda: monitor.status("slow").state != "up")  # the refresh failed
    record = await call_fails_fast_as_unavailable(core, "slow__echo")
    assert (record["stage"], record["decision"]) == ("refresh_gate", "error")
    assert gate.is_closed("slow")
    await until(lambda: monitor.status("slow").state == "down")
    await call_fails_fast_as_unavailable(core, "slow__wait")
    # The failing refresh is retried, less and less often, and republishes nothing: the view in force stays the
    # very same object. (Every 50 ms, as configured here, it would have been tried about 16 times in this second.)
    view = core.gateway.view
    with capture_logs() as logs:
        await asyncio.sleep(1.0)
    assert core.gateway.view is view
    assert not [e for e in logs if e["event"] == "catalogue.published"]
    assert 1 <= len([e for e in logs if e["event"] == "upstream.refresh_failed"]) <= 6
    assert gate.is_closed("slow")
    # Back: the gate opens with a view built from lists fetched after the announcement; calls work.
    up.reachable = True
    await until(lambda: monitor.status("slow").state == "up")
    await until(lambda: not gate.is_closed("slow"))
    assert core.gateway.view is not view
    result = await core.rpc("tools/call", {"name": "slow__echo", "arguments": {}})
    assert result["content"][0]["text"] == "{}"


async def test_a_closed_gate_of_an_upstream_known_down_fails_fast_before_any_refresh(
        slow: tuple[Core, MemoryUpstream, Held]) -> None:
    core, up, _ = slow
    monitor, gate = core.pool.monitor, core.pool.gate
    up.reachable = False
    for _ in range(2):
        with pytest.raises(UpstreamUnavailable):
            await core.rpc("tools/call", {"name": "slow__echo", "arguments": {}})
    await until(lambda: monitor.status("slow").state == "down")
    # Something asks for a gated re-fetch of a down upstream (a pin re-check, an approval): the call is refused
    # at once, before the refresher has even tried.
    core.pool.mark_dirty("slow")
    assert gate.is_closed("slow")
    record = await call_fails_fast_as_unavailable(core, "slow__echo")
    assert record["stage"] == "refresh_gate"


async def test_the_gate_still_holds_calls_while_a_reachable_upstreams_change_is_checked(
        slow: tuple[Core, MemoryUpstream, Held]) -> None:
    # The gate's real purpose is intact: an upstream that answers but whose re-check is slow gets -31010.
    core, up, _ = slow
    up.script("tools/list", delay=GATE_TIMEOUT_S + 1)
    await up.announce("notifications/tools/list_changed")
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        await core.rpc("tools/call", {"name": "slow__echo", "arguments": {}})
    assert getattr(info.value, "code", None) == -31010
    assert time.monotonic() - started >= GATE_TIMEOUT_S * 0.9
    assert core.records()[-1]["stage"] == "refresh_gate"
