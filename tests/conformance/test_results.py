"""The comparison the conformance test relies on, over hand-written checks.json trees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conformance.results import (
    format_regressions,
    load_baseline,
    load_results,
    parse_summary,
    regressions,
    unclean,
)


def write(root: Path, scenario: str, checks: list[dict[str, Any]], stamp: str = "2026-01-01T00-00-00-000Z") -> None:
    folder = root / f"server-{scenario}-{stamp}"
    folder.mkdir(parents=True)
    (folder / "checks.json").write_text(json.dumps(checks))


def ok(check_id: str) -> dict[str, Any]:
    return {"id": check_id, "name": check_id, "status": "SUCCESS"}


def test_a_check_lost_through_the_gateway_is_reported_with_its_message(tmp_path: Path) -> None:
    write(tmp_path / "a", "tools-call-with-logging", [ok("tools-call-with-logging")])
    write(tmp_path / "b", "tools-call-with-logging", [
        {"id": "tools-call-with-logging", "status": "FAILURE", "errorMessage": "No log notifications received"}])
    lost = regressions(load_results(tmp_path / "a"), load_results(tmp_path / "b"))
    assert lost == {"tools-call-with-logging": [
        "tools-call-with-logging: 0/1 SUCCESS -- FAILURE: No log notifications received"]}
    assert "No log notifications received" in format_regressions(lost)


def test_repeated_ids_count_and_info_details_explain(tmp_path: Path) -> None:
    write(tmp_path / "a", "multi", [ok("stream"), ok("stream"), ok("accepted")])
    write(tmp_path / "b", "multi", [ok("stream"), ok("accepted"), {
        "id": "stream", "status": "INFO", "details": {"message": "Server returned JSON"}}])
    assert regressions(load_results(tmp_path / "a"), load_results(tmp_path / "b")) == {
        "multi": ["stream: 1/2 SUCCESS -- INFO: Server returned JSON"]}


def test_extra_successes_warnings_and_unreported_scenarios(tmp_path: Path) -> None:
    write(tmp_path / "a", "ping", [ok("ping")])
    write(tmp_path / "a", "sse", [{"id": "priming", "status": "WARNING"}])
    write(tmp_path / "a", "gone", [ok("gone")])
    write(tmp_path / "b", "ping", [ok("ping"), ok("ping")])
    write(tmp_path / "b", "sse", [{"id": "priming", "status": "FAILURE"}])
    direct, through = load_results(tmp_path / "a"), load_results(tmp_path / "b")
    summary = parse_summary("FAIL gone      0 passed, 1 failed, 0 warnings  -- TIMEOUT after 20s\n")
    # A scenario with nothing succeeding directly cannot regress; one missing through the gateway does.
    assert regressions(direct, through, summary) == {
        "gone": ["no checks.json through the gateway (FAIL gone      0 passed, 1 failed, 0 warnings  -- "
                 "TIMEOUT after 20s)"]}
    assert unclean(direct) == {"sse"}


def test_latest_run_of_a_scenario_wins_and_baseline_reads_server_list(tmp_path: Path) -> None:
    write(tmp_path, "ping", [{"id": "ping", "status": "FAILURE"}], "2026-01-01T00-00-00-000Z")
    write(tmp_path, "ping", [ok("ping")], "2026-01-01T00-00-05-000Z")
    assert load_results(tmp_path)["ping"].clean
    baseline = tmp_path / "baseline.yml"
    baseline.write_text("server:\n  - server-sse-polling\nclient: [x]\n")
    assert load_baseline(baseline) == {"server-sse-polling"}
