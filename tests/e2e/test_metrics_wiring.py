"""The real gateway's /metrics: no series for features that are not configured, counters that count events once
across refreshes, refresh outcomes and per-tool latency, all from the app's own wiring (in process)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.hostile_server import QUARANTINED
from tests.support.gateway import REPO
from tests.support.inprocess import FrontDoor, front_door

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(door: FrontDoor) -> Samples:
    r = await door.client.get("/metrics")
    assert r.status_code == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def stdio(module: str) -> dict[str, object]:
    return {"command": [sys.executable, "-m", module, "--transport", "stdio"], "cwd": str(REPO), "era": "legacy"}


async def test_in_memory_gateway_metrics_count_once_and_omit_unconfigured_features(tmp_path: Path) -> None:
    upstreams = {"basic": stdio("tests.fixtures.basic_server"), "hostile": stdio("tests.fixtures.hostile_server")}
    async with front_door(tmp_path, upstreams=upstreams, catalogue={"refresh_interval": "1s"}) as door:
        headers = await door.session()
        r = await door.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                             "params": {"name": "basic__echo", "arguments": {"message": "hi"}}}, headers)
        assert r.status_code == 200, r.text
        first = await scrape(door)
        # Several periodic refreshes later, every one re-fetching the same hostile schemas.
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            later = await scrape(door)
            ok = later.get(("bastion_catalogue_refreshes_total",
                            frozenset({("upstream", "hostile"), ("outcome", "ok")})), 0)
            if ok >= 4 or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.5)

    assert ok >= 4, "the periodic refresh did not run"
    names = {name for name, _ in later}
    # No Redis configured: no Redis gauge at all (a 0 would fire BastionLimiterRedisDown / BastionRedisDown).
    assert not {n for n in names if "redis" in n}, names
    quarantined = ("bastion_validation_actions_total", frozenset({("direction", "input"), ("action", "quarantined")}))
    # Some of the fixture's hostile tools are dropped before schema compilation; the rest enter quarantine once.
    assert 0 < first[quarantined] <= len(QUARANTINED)
    assert later[quarantined] == first[quarantined]
    assert later[("bastion_tool_call_duration_seconds_count",
                  frozenset({("tool", "basic__echo"), ("upstream", "basic")}))] == 1
    assert later[("bastion_sessions_started_total", frozenset())] == 1
    assert later[("bastion_upstream_up", frozenset({("upstream", "hostile")}))] == 1
    assert later[("bastion_catalogue_tools", frozenset())] > 0
