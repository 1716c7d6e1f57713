"""The side-by-side benchmark runs end to end, in a smoke mode, so that it cannot rot.

Only bastion's three configurations, the two Python floors and the direct target, against the bespoke Python upstream
(nginx, FastMCP and the TypeScript SDK would be installed on first use: not something a test should do), for a
fraction of a second per run. Nothing here asserts on timing: only that calls were made and answered without
error, and that the tables have the rows and columns the docs quote. The baseline run compares HEAD with itself
(any checkout has it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from tests.bench.markdown import tables

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
NUMBER = re.compile(r"-?\d+\.\d+")
FLOOR = "floor: uvicorn and bastion's upstream pool forwarding bytes"
FLOOR_LEAN = "floor without uvicorn: a bare protocol and bastion's upstream pool"


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)


def test_sidebyside_runs_bastion_and_direct_at_two_concurrencies() -> None:
    done = run("sidebyside.py", "--upstream", "fast", "--targets",
               "direct,floor-lean,floor,bastion-off,bastion-defaults,bastion-full",
               "--concurrency", "1,3", "--duration", "0.4", "--warmup", "0.1", "--rounds", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    for line in ("Machine: ", "Commit: ", "Command: python bench/sidebyside.py --upstream fast", "Pinning: "):
        assert line in done.stdout
    c1, c3, summary, scale = tables(done.stdout)
    for detail in (c1, c3):
        header, *rows = detail
        assert header[:5] == ["target", "calls/s", "p50 ms", "p99 ms", "proxy CPU ms/call"]
        by_label = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
        assert list(by_label) == ["direct (the upstream alone)", FLOOR_LEAN, FLOOR, "bastion, everything off",
                                  "bastion defaults", "bastion full"]
        for label, row in by_label.items():
            assert row["errors"] == "0", label
            assert float(row["calls/s"].replace(",", "")) > 0, label
            assert NUMBER.fullmatch(row["upstream CPU ms/call"]), label
        # Only a proxy has proxy CPU; only the full configuration talks to Redis.
        assert by_label["direct (the upstream alone)"]["proxy CPU ms/call"] == "—"
        assert all(NUMBER.fullmatch(by_label[b]["proxy CPU ms/call"])
                   for b in (FLOOR_LEAN, FLOOR, "bastion, everything off", "bastion defaults", "bastion full"))
        assert NUMBER.fullmatch(by_label["bastion full"]["Redis CPU ms/call"])
        assert by_label["bastion defaults"]["Redis CPU ms/call"] == "—"
        # No nginx or FastMCP ran, so there is nothing to compare with.
        assert {row["CPU vs nginx"] for row in by_label.values()} == {"—"}
    assert summary[0][:3] == ["target", "CPU ms/call c=1", "CPU ms/call c=3"]
    assert [row[0] for row in summary[1:]] == [FLOOR_LEAN, FLOOR, "bastion, everything off", "bastion defaults",
                                               "bastion full"]
    for row in summary[1:]:
        assert re.fullmatch(r"\d+\.\d\d(\u2013\d+\.\d\d)?", row[1]), row  # one figure or a range over 2 rounds
    assert "CPU vs baseline" not in c1[0] and "CPU vs baseline c=1" not in summary[0]  # no --baseline, no column
    assert_scale_out(done.stdout, scale, ["bastion full"], [3, 1])


def assert_scale_out(stdout: str, scale: list[list[str]], labels: list[str], levels: list[int]) -> None:
    """The scale-out section: a row per full target and concurrency (highest first), figures from Redis's INFO,
    and the derivation for the first row."""
    assert "\n### Scale-out on paper\n" in stdout
    header, *rows = scale
    assert header[:4] == ["target", "c", "bastion CPU ms/call", "Redis CPU ms/call (INFO)"]
    assert header[-1] == "replicas per Redis at 70%"
    assert [(row[0], int(row[1])) for row in rows] == [(lab, c) for lab in labels for c in levels]
    for row in rows:
        cells = dict(zip(header, row, strict=True))
        assert NUMBER.fullmatch(cells["Redis CPU ms/call (INFO)"]), row
        assert float(cells["Redis commands/call"]) >= 1, row  # the session and the limit, at least
        assert NUMBER.fullmatch(cells["replicas per Redis at 70%"]), row
    assert re.search(r"Redis commands per call \(bastion full, c=\d+; .*`evalsha` \d+\.\d\d", stdout)
    assert re.search(r"one bastion replica on one core serves 1000 / \d+\.\d+ ms = \*\*[\d,]+ calls/s\*\*", stdout)
    assert re.search(r"\*\*one Redis serves \d+ single-core replicas\*\* before it saturates", stdout)
    assert "Assumptions: Redis runs commands on one thread" in stdout


def test_sidebyside_runs_bastion_beside_a_baseline_revision() -> None:
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    done = run("sidebyside.py", "--upstream", "fast", "--targets", "direct,bastion-off,bastion-full",
               "--baseline", "HEAD", "--concurrency", "1,2", "--duration", "0.3", "--warmup", "0.1", "--rounds", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Baseline: {head} (" in done.stdout
    assert f"bench/.cache/baseline-{head}" in done.stdout
    assert "Baseline config: the same as the working tree's" in done.stdout
    c1, c2, summary, scale = tables(done.stdout)
    off, full = "bastion, everything off", "bastion full"
    for detail in (c1, c2):
        header, *rows = detail
        assert header[-2:] == ["CPU vs baseline", "errors"]
        by_label = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
        # Each baseline twin right after its counterpart, so the two run back to back.
        assert list(by_label) == ["direct (the upstream alone)", off, f"{off} @{head}", full, f"{full} @{head}"]
        assert all(row["errors"] == "0" for row in by_label.values())
        assert NUMBER.fullmatch(by_label[off]["CPU vs baseline"])
        assert NUMBER.fullmatch(by_label[full]["CPU vs baseline"])
        assert by_label[f"{full} @{head}"]["CPU vs baseline"] == "—"
        assert NUMBER.fullmatch(by_label[f"{full} @{head}"]["Redis CPU ms/call"])  # a Redis of its own
    assert summary[0][-2:] == ["CPU vs baseline c=1", "CPU vs baseline c=2"]
    by_label = {row[0]: row for row in summary[1:]}
    assert all(NUMBER.fullmatch(cell) for cell in by_label[full][-2:])
    assert by_label[f"{full} @{head}"][-2:] == ["—", "—"]
    assert_scale_out(done.stdout, scale, [full, f"{full} @{head}"], [2, 1])


def test_sidebyside_refuses_a_baseline_with_no_bastion_target() -> None:
    done = run("sidebyside.py", "--targets", "direct,nginx", "--baseline", "HEAD")
    assert done.returncode == 2
    assert "--baseline: no bastion target" in done.stderr


def test_sidebyside_refuses_an_unknown_target() -> None:
    done = run("sidebyside.py", "--targets", "direct,haproxy")
    assert done.returncode == 2
    assert "unknown ['haproxy']" in done.stderr


def test_structured_echo_answers_with_structured_content(bench_modules: None) -> None:
    from upstream_fast import Catalogue, answer

    catalogue = Catalogue.build(structured=True)
    assert catalogue.tools[0]["outputSchema"]["required"] == ["text"]
    call: dict[str, Any] = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                            "params": {"name": "echo", "arguments": {"text": "hi"}}}
    _, body, _ = answer(call, catalogue)
    assert orjson.loads(body)["result"]["structuredContent"] == {"text": "hi"}
    _, plain, _ = answer(call)
    assert "structuredContent" not in orjson.loads(plain)["result"]


def test_bastion_configurations_switch_off_what_they_say(bench_modules: None, tmp_path: Path) -> None:
    from harness import ApiKey
    from sidebyside import bastion_config

    key = ApiKey.new("bench")
    common = {"port": 1, "upstream_url": "http://127.0.0.1:2/mcp", "work": tmp_path, "redis_url": "redis://x:3/0",
              "key": key}
    off = bastion_config("bastion-off", **common)
    assert (off["auth"], off["audit"], off["validation"], off["sanitize"], off["pinning"]) == (
        "none", {"sinks": []}, {"output": "off"}, {"enabled": False}, {"enabled": False})
    assert "policies" not in off and "rate_limits" not in off and "redis" not in off
    defaults = bastion_config("bastion-defaults", **common)
    assert "validation" not in defaults and "sanitize" not in defaults  # bastion's own defaults apply
    assert "file" in defaults["audit"]["sinks"][0]
    assert bastion_config("bastion-off@3e463c6", **common) == off  # a baseline twin: the same configuration
    full = bastion_config("bastion-full", **common)
    assert full["auth"] == {"api_keys": [dict(key.entry)]} and full["redis"] == {"url": "redis://x:3/0"}
    assert full["rate_limits"]["defaults"][0]["per"] == "principal"
    assert (tmp_path / "policies" / "bench.yaml").exists()
