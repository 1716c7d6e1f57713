"""The load generator runs end to end: it starts the upstream and a real gateway, loads them, prints its table.

Bounded runs (a fraction of a second, two sessions); nothing here asserts on timing, only that calls were made and
answered without errors and that the summary has the shape the docs quote.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.net import free_port, wait_for_port

REPO = Path(__file__).resolve().parents[2]
LOADGEN = REPO / "bench" / "loadgen.py"
UPSTREAM = REPO / "bench" / "upstream_fast.py"


def run_loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(LOADGEN), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)


def table_rows(stdout: str) -> dict[str, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("| ") and not line.startswith("| scenario"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells
    return rows


@pytest.fixture
def upstream() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(UPSTREAM), "--port", str(port)], stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_scenarios_direct_and_through_bastion_print_one_table() -> None:
    done = run_loadgen("--scenario", "direct", "--scenario", "plain", "--concurrency", "2", "--duration", "0.5",
                       "--warmup", "0")
    assert done.returncode == 0, done.stderr
    assert "| scenario | calls/s | p50 ms | p90 ms | p99 ms | errors | gateway CPU ms/call |" in done.stdout
    rows = table_rows(done.stdout)
    assert set(rows) == {"upstream direct", "bastion: no policy, no limits"}
    for label, cells in rows.items():
        assert int(cells[1].replace(",", "")) > 0, label  # calls/s
        assert cells[5] == "0", label  # errors
    # The gateway's CPU is measured only where a gateway runs; the upstream's in both rows.
    assert rows["upstream direct"][6] == "—"
    assert re.fullmatch(r"\d+\.\d{3}", rows["bastion: no policy, no limits"][6])
    assert re.fullmatch(r"\d+\.\d{3}", rows["upstream direct"][7])
    assert "Machine: " in done.stdout


def test_target_mode_stops_after_the_requested_calls(upstream: str) -> None:
    done = run_loadgen("--target", f"{upstream},label=fast", "--concurrency", "2", "--calls", "40",
                       "--duration", "60", "--warmup", "0", "--args", '{"text": "x"}')
    assert done.returncode == 0, done.stderr
    assert re.search(r"fast: 4\d calls in [\d.]+ s, 0 errors", done.stderr), done.stderr
    assert list(table_rows(done.stdout)) == ["fast"]


def test_tool_errors_are_counted_and_fail_the_run(upstream: str) -> None:
    done = run_loadgen("--target", upstream, "--tool", "no-such-tool", "--concurrency", "1", "--calls", "5",
                       "--warmup", "0")
    assert done.returncode == 1
    assert "Method not found: tools/call" in done.stderr or "JSON-RPC error -32601" in done.stderr, done.stderr
    assert table_rows(done.stdout)[upstream][5] == "5"


def test_an_unreachable_target_is_reported_not_raised() -> None:
    done = run_loadgen("--target", f"http://127.0.0.1:{free_port()}/mcp", "--duration", "1", "--warmup", "0")
    assert done.returncode == 1
    assert "loadgen: cannot connect to 127.0.0.1:" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
