"""The catalogue-at-scale benchmark runs end to end, in a smoke mode, so that it cannot rot.

A tiny catalogue (2 upstreams x 6 tools, pages of 5) and a fraction of a second of listing. Nothing here asserts on
timing: only that the catalogue was built, that each listing returned exactly the tools the caller may see, and
that the table has the rows and columns the docs quote.
"""

from __future__ import annotations

import pstats
import re
import subprocess
import sys
from pathlib import Path

import orjson

from tests.bench.markdown import tables

REPO = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"-?\d+\.\d+")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "bench" / "catalogue_scale.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


def test_catalogue_scale_builds_and_lists_with_and_without_a_policy() -> None:
    done = run("--upstreams", "2", "--tools", "5", "--page-size", "4", "--duration", "0.3", "--warmup", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Catalogue: 2 HTTP upstreams x 5 tools = 10 tools" in done.stdout
    (header, *rows), = tables(done.stdout)
    by_case = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert list(by_case) == ["none (all tools)", "half (`*_read` only)"]
    # 10 tools in pages of 4; the policy lets the caller see the 2 read tools of each upstream (echo is not one).
    assert (by_case["none (all tools)"]["tools visible"], by_case["none (all tools)"]["pages"]) == ("10", "3")
    assert (by_case["half (`*_read` only)"]["tools visible"], by_case["half (`*_read` only)"]["pages"]) == ("4", "1")
    for case, row in by_case.items():
        assert row["errors"] == "0", case  # every listing returned exactly the tools the caller may see
        assert int(row["listings"]) > 0, case
        assert int(row["publishes"]) >= 1, case
        for column in ("listing CPU ms", "build CPU ms/tool", "build-to-quiet CPU ms/tool"):
            assert NUMBER.fullmatch(row[column]), (case, column)


def test_generated_tools_are_the_size_the_scenario_claims(bench_modules: None) -> None:
    from upstream_fast import Catalogue, answer

    catalogue = Catalogue.build(tools=100)
    names = [tool["name"] for tool in catalogue.tools]
    assert len(set(names)) == 100 and names[0] == "echo"
    assert sum(name.endswith("_read") for name in names) == 50
    sizes = [len(orjson.dumps({**tool, "name": f"u00__{tool['name']}"})) for tool in catalogue.tools[1:]]
    assert min(sizes) >= 1200 and max(sizes) <= 1400
    status, body, _ = answer({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, catalogue)
    assert status == 200 and len(orjson.loads(body)["result"]["tools"]) == 100


def test_raw_listings_are_measured_and_the_listing_phase_profiled(tmp_path: Path) -> None:
    done = run("--upstreams", "2", "--tools", "5", "--page-size", "4", "--duration", "0.3", "--warmup", "0",
               "--cases", "none", "--raw", "--profile", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(raw: answers not decoded)" in done.stdout
    (header, row), = tables(done.stdout)
    measured = dict(zip(header, row, strict=True))
    assert measured["errors"] == "0" and int(measured["listings"]) > 0 and measured["pages"] == "3"
    # The profile holds the listing phase: the gateway's tools/list handler ran while it was on.
    stats = pstats.Stats(str(tmp_path / "none-0.prof"))
    assert any(name == "_tools_list" for (_, _, name) in stats.stats)
