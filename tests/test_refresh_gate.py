"""The refresh gate and the catalogue limits, in process: the gate primitive, the pool's use of it with a real
stdio upstream that changes a tool, and ``ListBudget`` against hostile listings."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from bastion.catalogue import UpstreamLists
from bastion.catalogue_limits import CatalogueLimits, LimitDrop, ListBudget
from bastion.errors import ConfigError
from bastion.pinning import PinRecheck
from bastion.refresh_gate import RefreshGate, RefreshRequests
from bastion.upstream.stdio import StdioUpstream
from bastion.upstream_pool import Member, UpstreamPool
from tests.support.loop import ticking

ROOT = Path(__file__).resolve().parents[1]


async def test_a_gate_opens_only_for_a_fetch_started_after_the_last_announcement() -> None:
    gate = RefreshGate()
    assert not gate.is_closed("a") and await gate.wait_open("a", 0.01)
    gate.announce("a")
    fetched_before = gate.generation("a") - 1
    assert gate.published({"a": fetched_before}) == []  # lists fetched before the announcement prove nothing
    assert gate.is_closed("a")
    waiter = asyncio.create_task(gate.wait_open("a", 5))
    await asyncio.sleep(0)
    assert gate.published({"a": gate.generation("a")}) == ["a"]
    assert await waiter is True
    assert not gate.is_closed("a")


async def test_a_gate_that_closes_again_keeps_waiters_waiting_and_times_out() -> None:
    gate = RefreshGate()
    gate.announce("a")
    waiter = asyncio.create_task(gate.wait_open("a", 0.2))
    await asyncio.sleep(0)
    generation = gate.generation("a")
    gate.announce("a")  # a second announcement while the first refresh runs
    gate.published({"a": generation})  # the first refresh publishes: not enough
    assert gate.is_closed("a")
    assert await waiter is False


async def test_a_held_gate_opens_with_the_publish_of_the_list_that_closed_it() -> None:
    gate = RefreshGate()
    generation = gate.generation("a")
    gate.hold("a")  # a fetched list differs from the published one; the fetch started at `generation`
    assert gate.is_closed("a")
    assert gate.published({"b": 7}) == []
    assert gate.published({"a": generation}) == ["a"]


async def test_an_unreachable_upstreams_closed_gate_stays_closed_but_holds_nobody() -> None:
    gate = RefreshGate()
    gate.announce("a")
    waiter = asyncio.create_task(gate.wait_open("a", 5))
    await asyncio.sleep(0)
    started = asyncio.get_running_loop().time()
    gate.unreachable("a", "list refresh failed: connection refused")  # its refresh cannot succeed now
    assert await waiter is False  # woken at once, not after 5 s
    assert asyncio.get_running_loop().time() - started < 1
    assert gate.is_closed("a")  # nothing unchecked gets through: the gate itself stays closed
    assert gate.unreachable_reason("a") == "list refresh failed: connection refused"
    assert await asyncio.wait_for(gate.wait_open("a", 5), 1) is False  # later calls do not wait either
    gate.reachable("a")  # it answered again: calls wait for the refresh as usual
    assert gate.unreachable_reason("a") is None
    assert await gate.wait_open("a", 0.05) is False  # waited, timed out
    waiter = asyncio.create_task(gate.wait_open("a", 5))
    await asyncio.sleep(0)
    assert gate.published({"a": gate.generation("a")}) == ["a"]
    assert await waiter is True


async def test_an_unreachable_upstream_with_an_open_gate_is_left_to_the_forward() -> None:
    gate = RefreshGate()
    gate.unreachable("a", "upstream is down")
    assert not gate.is_closed("a") and await gate.wait_open("a", 0.01)
    gate.announce("a")  # the gate closes while it is down: nobody waits
    assert await asyncio.wait_for(gate.wait_open("a", 5), 1) is False


async def test_refresh_requests_wake_the_refresher_and_gate_only_when_asked() -> None:
    requests = RefreshRequests()
    assert await requests.wait(0.01) is False  # nothing asked: the periodic refresh's turn
    requests.mark_dirty("a")
    requests.mark_dirty("b", gate=False)  # a recovered upstream: re-fetch, but its tools stay callable
    assert await requests.wait(1.0) is True
    assert requests.gate.is_closed("a") and not requests.gate.is_closed("b")
    assert requests.take(also=["c"]) == {"a", "b", "c"}
    assert await requests.wait(0.01) is False  # taken: the next wait needs a new request
    assert requests.take_republish() is False
    requests.republish_soon()
    assert await requests.wait(1.0) is True and requests.take() == set()
    assert requests.take_republish() is True and requests.take_republish() is False


async def test_a_pin_recheck_asks_once_per_upstream_until_it_fires() -> None:
    requests = RefreshRequests()
    recheck = PinRecheck(requests, delay_s=0.05)
    recheck("a")
    recheck("a")  # already scheduled: no second request
    assert await requests.wait(0.02) is False
    assert await requests.wait(1.0) is True
    assert requests.take() == {"a"} and requests.gate.is_closed("a")  # the re-fetch is gated like an announcement
    recheck("a")  # fired, so a new degraded refresh schedules the next one
    assert await requests.wait(1.0) is True and requests.take() == {"a"}


def rugpull() -> StdioUpstream:
    return StdioUpstream("rug", [sys.executable, "-m", "tests.fixtures.rugpull_server", "--transport", "stdio"],
                         cwd=str(ROOT), era="legacy")


class SlowRebuild:
    """An ``on_change`` that records what it published and can be held mid-rebuild."""

    def __init__(self) -> None:
        self.published: list[Mapping[str, UpstreamLists]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.entered = asyncio.Event()

    async def __call__(self, lists: Mapping[str, UpstreamLists]) -> None:
        self.entered.set()
        await self.release.wait()
        self.published.append(lists)


@pytest.fixture
async def pool() -> AsyncIterator[tuple[UpstreamPool, SlowRebuild]]:
    rebuild = SlowRebuild()
    pool = UpstreamPool([Member(rugpull(), "rug", 10.0)], rebuild, debounce_s=0.05, refresh_interval_s=None)
    await pool.start()
    try:
        yield pool, rebuild
    finally:
        await pool.close()


def description(lists: UpstreamLists, tool: str) -> str:
    return next(str(t.get("description")) for t in lists.tools if t.get("name") == tool)


async def test_an_unannounced_change_gates_the_upstream_until_its_view_is_published(
        pool: tuple[UpstreamPool, SlowRebuild]) -> None:
    up, rebuild = pool
    assert not up.gate.is_closed("rug")
    await up.member("rug").upstream.request("tools/call", {"name": "flip_silent", "arguments": {}}, timeout=10)
    rebuild.release.clear()
    rebuild.entered.clear()
    refresh = asyncio.create_task(up.refresh_now())
    await asyncio.wait_for(rebuild.entered.wait(), 10)
    # The changed listing is in hand but its view is not live yet: the upstream's tools are gated.
    assert up.gate.is_closed("rug")
    rebuild.release.set()
    await refresh
    assert not up.gate.is_closed("rug")
    assert "Version 2" in description(rebuild.published[-1]["rug"], "transfer")


async def test_an_unchanged_refresh_never_gates(pool: tuple[UpstreamPool, SlowRebuild]) -> None:
    up, rebuild = pool
    rebuild.release.clear()
    rebuild.entered.clear()
    refresh = asyncio.create_task(up.refresh_now())
    await asyncio.wait_for(rebuild.entered.wait(), 10)
    assert not up.gate.is_closed("rug")
    rebuild.release.set()
    await refresh


async def test_an_unchanged_refresh_hands_on_the_very_lists_it_had(pool: tuple[UpstreamPool, SlowRebuild]) -> None:
    # The view publisher recognises unchanged lists by identity and rebuilds nothing derived from them.
    up, rebuild = pool
    await up.refresh_now()
    await up.refresh_now()
    first, second = rebuild.published[-2]["rug"], rebuild.published[-1]["rug"]
    assert second is first
    await up.member("rug").upstream.request("tools/call", {"name": "flip_silent", "arguments": {}}, timeout=10)
    await up.refresh_now()
    assert rebuild.published[-1]["rug"] is not first
    assert "Version 2" in description(rebuild.published[-1]["rug"], "transfer")


async def test_an_announcement_gates_until_a_later_fetch_is_published(pool: tuple[UpstreamPool, SlowRebuild]) -> None:
    up, rebuild = pool
    before = len(rebuild.published)
    await up.member("rug").upstream.request("tools/call", {"name": "flip", "arguments": {}}, timeout=10)
    for _ in range(100):
        if up.gate.is_closed("rug"):
            break
        await asyncio.sleep(0.01)
    assert up.gate.is_closed("rug")  # closed by the notification itself, before any refresh ran
    assert await up.gate.wait_open("rug", 10)
    assert len(rebuild.published) > before


async def test_a_failed_rebuild_keeps_the_gate_closed() -> None:
    async def broken(lists: Mapping[str, UpstreamLists]) -> None:
        raise RuntimeError("view step failed")

    pool = UpstreamPool([Member(rugpull(), "rug", 10.0)], broken, debounce_s=0.05, refresh_interval_s=None)
    await pool.start()
    try:
        pool.mark_dirty("rug")
        assert not await pool.gate.wait_open("rug", 0.5)
    finally:
        await pool.close()


# -- ListBudget ---------------------------------------------------------------------------------------------


def tool(name: str, **extra: object) -> dict[str, object]:
    return {"name": name, "inputSchema": {"type": "object"}, **extra}


async def test_a_budget_keeps_the_first_items_and_names_what_it_dropped() -> None:
    budget = ListBudget("up", "tools", CatalogueLimits(max_tools=3))
    assert await budget.add_page([tool(f"t{i}") for i in range(50_000)]) is False
    assert [t["name"] for t in budget.items] == ["t0", "t1", "t2"]
    (drop,) = budget.drops()
    assert (drop.limit, drop.bound, drop.dropped, drop.names[:2]) == ("max_tools", 3, 49_997, ("t3", "t4"))
    assert len(drop.names) == 10


async def test_a_budget_drops_oversized_definitions_and_schemas_but_keeps_the_rest() -> None:
    limits = CatalogueLimits(max_definition_bytes=10_000, max_schema_bytes=1_000)
    budget = ListBudget("up", "tools", limits)
    page = [tool("a"), tool("desc", description="x" * 30_000_000), tool("schema", outputSchema={"d": "y" * 2000}),
            {"no": "name"} , "not a mapping", tool("b")]
    assert await budget.add_page(page) is True
    assert [t.get("name") for t in budget.items] == ["a", None, "b"]
    drops = {d.limit: d for d in budget.drops()}
    assert drops["max_definition_size"].names == ("desc",)
    assert drops["max_schema_size"].names == ("schema",)


async def test_a_budget_stops_at_the_total_size_of_a_list() -> None:
    budget = ListBudget("up", "resources", CatalogueLimits(max_list_bytes=2_000))
    page = [{"uri": f"file:///{i}", "name": "n" * 100} for i in range(100)]
    assert await budget.add_page(page) is False
    assert 10 <= len(budget.items) < 20
    (drop,) = budget.drops()
    assert drop.limit == "max_list_size" and drop.dropped == 100 - len(budget.items)
    assert drop.names[0] == f"file:///{len(budget.items)}"


async def test_a_budget_counts_pages() -> None:
    budget = ListBudget("up", "prompts", CatalogueLimits(max_pages=2))
    for _ in range(2):
        assert await budget.add_page([{"name": "p"}])
    assert not budget.pages_left
    budget.more_pages_refused()
    assert budget.drops() == [LimitDrop("up", "prompts", "max_pages", 2, 0, ())]


async def test_a_huge_page_leaves_the_loop_free_in_between() -> None:
    async with ticking() as ticks:
        budget = ListBudget("up", "tools", CatalogueLimits(max_tools=200_000, max_list_bytes=1 << 30))
        await budget.add_page([tool(f"t{i}", description="d" * 200) for i in range(100_000)])
        seen = ticks.count
    assert len(budget.items) == 100_000
    assert seen > 1  # the walk handed the loop back between slices, not only at the end


def test_limits_config_reads_sizes_and_refuses_unknown_keys() -> None:
    limits = CatalogueLimits.from_mapping({"max_tools": 10, "max_definition_size": "64KiB", "max_pages": 5})
    assert (limits.max_tools, limits.max_definition_bytes, limits.max_pages) == (10, 65536, 5)
    assert CatalogueLimits.from_mapping(None) == CatalogueLimits()
    with pytest.raises(ConfigError, match="max_tool"):
        CatalogueLimits.from_mapping({"max_tool": 1})
    with pytest.raises(ConfigError, match=">= 1"):
        CatalogueLimits.from_mapping({"max_pages": 0})
