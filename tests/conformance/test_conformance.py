"""The official MCP conformance harness against our fixture upstreams, directly and through bastion.

Two suites, one per protocol era, each pinned to a harness version (see ``.ci/conformance.sh``):

* **handshake era** -- every server scenario of ``@modelcontextprotocol/conformance`` 0.1.16 against
  ``tests.fixtures.conformance_server`` (the SDK's low-level ``Server``);
* **2026-07-28** -- every server scenario of 0.2.0-alpha.12 that applies to the 2026-07-28 revision, run on that
  revision's stateless wire (``--spec-version 2026-07-28``), against ``tests.fixtures.conformance_modern_server``
  (the SDK's ``MCPServer``).

Each suite runs directly against its fixture over Streamable HTTP; the set of scenarios that are not clean there
must be exactly the suite's ``expected-failures-*.yml``. Then the same scenarios run against bastion fronting that
fixture unprefixed, as a stdio upstream and as a Streamable HTTP upstream (and, for the 2026-07-28 suite, with the
upstream's era pinned to ``modern`` and detected with ``auto``), and every check that succeeded directly must
succeed through bastion too. A failure prints, per scenario, the checks lost and the harness's message for each.

The harnesses and a node >= 22 are installed from npm on first use into ``$PEERS_DIR`` (default
``~/.cache/bastion-peers``) and reused afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.results import (
    Scenario,
    format_regressions,
    load_baseline,
    load_results,
    parse_summary,
    regressions,
    unclean,
)
from tests.support.fixture_server import FixtureServer
from tests.support.gateway import REPO, GatewayProcess

SCRIPT = REPO / ".ci" / "conformance.sh"
SCENARIO_TIMEOUT = 20
# Scenarios are independent (each opens its own MCP session, or none on the stateless wire), so a few harness
# processes share a run; this bounds the worst case (every scenario hanging) to len/WORKERS * SCENARIO_TIMEOUT.
WORKERS = 4
INSTALL_TIMEOUT = 900
LIST_RE = re.compile(r"^  - (\S+)")
# Scenarios that change the upstream's lists (server-stateless pulls test_trigger_tool_change); they run alone after
# the rest, so that tools-list's "consecutive listings are identical" check never sees a change mid-scenario.
ALONE = frozenset({"server-stateless"})
# Scenarios whose tool makes the upstream ask the client something (sampling, elicitation). A stdio upstream's
# request carries nothing that says which call it belongs to; with several callers in flight bastion relays it
# only among one principal's calls, and every harness client here is the same anonymous principal, so run in
# parallel they could be asked each other's questions. A stdio upstream serves them one call at a time.
ASKS_THE_CLIENT = frozenset({"tools-call-sampling", "tools-call-elicitation", "elicitation-sep1034-defaults",
                             "elicitation-sep1330-enums"})


@dataclass(frozen=True, slots=True)
class Suite:
    """One harness version, the wire revision its scenarios run at, and the fixture upstream they expect."""

    name: str
    version: str
    spec_version: str | None
    fixture: str
    baseline: Path

    def script_args(self) -> list[str]:
        return ["--spec-version", self.spec_version] if self.spec_version else []


LEGACY = Suite("handshake", "0.1.16", None, "tests.fixtures.conformance_server",
               Path(__file__).with_name("expected-failures-direct.yml"))
MODERN = Suite("2026-07-28", "0.2.0-alpha.12", "2026-07-28", "tests.fixtures.conformance_modern_server",
               Path(__file__).with_name("expected-failures-direct-2026-07-28.yml"))


@dataclass(frozen=True, slots=True)
class Run:
    results: dict[str, Scenario]
    summary: dict[str, str]
    stdout: str


@dataclass(frozen=True, slots=True)
class Harness:
    suite: Suite
    env: dict[str, str]
    scenarios: list[str]


def peers_dir() -> str:
    return os.environ.get("PEERS_DIR") or str(Path.home() / ".cache" / "bastion-peers")


def install(suite: Suite) -> Harness:
    env = {**os.environ, "PEERS_DIR": peers_dir(), "SCENARIO_TIMEOUT": str(SCENARIO_TIMEOUT),
           "CONFORMANCE_VERSION": suite.version}
    done = subprocess.run(["bash", str(SCRIPT), "--install"], env=env, capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT, check=False)
    assert done.returncode == 0, f"installing the conformance harness failed:\n{done.stdout}\n{done.stderr}"
    env["CONFORMANCE_NODE"] = done.stdout.strip().splitlines()[-1]
    done = subprocess.run(["bash", str(SCRIPT), "--list", *suite.script_args()], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    names = [m[1] for line in done.stdout.splitlines() if (m := LIST_RE.match(line))]
    assert names, f"the harness listed no server scenarios:\n{done.stdout}\n{done.stderr}"
    return Harness(suite, env, names)


@pytest.fixture(scope="module")
def legacy_harness() -> Harness:
    return install(LEGACY)


@pytest.fixture(scope="module")
def modern_harness() -> Harness:
    return install(MODERN)


def run_harness(url: str, out_dir: Path, harness: Harness, alone: frozenset[str] = ALONE) -> Run:
    """Every scenario of ``harness`` against ``url``, in parallel workers, then those in ``alone`` one by one."""
    names = [n for n in harness.scenarios if n not in alone]
    chunks = [names[i::WORKERS] for i in range(WORKERS) if names[i::WORKERS]]

    def one(chunk: list[str]) -> str:
        args = ["bash", str(SCRIPT), url, *harness.suite.script_args()]
        for name in chunk:
            args += ["--scenario", name]
        done = subprocess.run(args, env={**harness.env, "CONFORMANCE_OUT": str(out_dir)}, capture_output=True,
                              text=True, timeout=len(chunk) * (SCENARIO_TIMEOUT + 10) + 60, check=False)
        return done.stdout + done.stderr

    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        stdout = "\n".join(pool.map(one, chunks))
    serial = [n for n in harness.scenarios if n in alone]
    if serial:
        stdout += "\n" + one(serial)
    return Run(load_results(out_dir), parse_summary(stdout), stdout)


def run_direct(harness: Harness, workdir: Path) -> Run:
    server = FixtureServer(harness.suite.fixture, log=workdir / "fixture.log")
    try:
        return run_harness(server.url, workdir / "out", harness)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def legacy_direct(tmp_path_factory: pytest.TempPathFactory, legacy_harness: Harness) -> Run:
    return run_direct(legacy_harness, tmp_path_factory.mktemp("conformance-direct"))


@pytest.fixture(scope="module")
def modern_direct(tmp_path_factory: pytest.TempPathFactory, modern_harness: Harness) -> Run:
    return run_direct(modern_harness, tmp_path_factory.mktemp("conformance-direct-modern"))


def assert_matches_baseline(direct: Run, harness: Harness) -> None:
    missing = sorted(set(harness.scenarios) - set(direct.results))
    assert not missing, f"no checks.json for {missing}:\n{direct.stdout}"
    baseline = harness.suite.baseline
    expected = load_baseline(baseline)
    failing = unclean(direct.results)
    assert failing == expected, (
        f"not clean directly but not in {baseline.name}: {sorted(failing - expected)}; "
        f"in {baseline.name} but clean now: {sorted(expected - failing)}\n{direct.stdout}")
    # The comparison through bastion is only meaningful if the direct run proves something in every scenario.
    assert all(direct.results[name].successes() for name in set(harness.scenarios) - expected)


def test_fixture_passes_every_scenario_but_the_baseline(legacy_direct: Run, legacy_harness: Harness) -> None:
    assert_matches_baseline(legacy_direct, legacy_harness)


def test_modern_fixture_passes_every_2026_07_28_scenario_but_the_baseline(
        modern_direct: Run, modern_harness: Harness) -> None:
    assert_matches_baseline(modern_direct, modern_harness)


def upstream(suite: Suite, transport: str, era: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if transport == "stdio":
        return {"command": [sys.executable, "-m", suite.fixture, "--transport", "stdio"], "cwd": str(REPO),
                "prefix": None, "era": era}
    server = FixtureServer(suite.fixture, log=request.getfixturevalue("tmp_path") / "fixture.log")
    request.addfinalizer(server.stop)
    return {"url": server.url, "prefix": None, "era": era}


# Checks that fail against the fixture directly (its baseline) but that bastion's own front door passes, so they
# must succeed through bastion: (scenario, check id).
BEYOND_DIRECT = {
    # SEP-2243 / RFC 9110 5.5: bastion compares header values without their optional whitespace; the SDK does not.
    MODERN.name: [("http-header-validation", "sep-2243-server-accepts-whitespace-header-value")],
}


def assert_no_regressions(direct: Run, harness: Harness, conf: dict[str, Any], tmp_path: Path, label: str) -> None:
    gateway = GatewayProcess({"listen": {"path": "/mcp"}, "auth": "none", "upstreams": {"conf": conf}},
                             tmp_path).start()
    alone = ALONE | ASKS_THE_CLIENT if "command" in conf else ALONE
    try:
        through = run_harness(gateway.url, tmp_path / "out", harness, alone)
    finally:
        gateway.stop()
    lost = regressions(direct.results, through.results, through.summary)
    for scenario, check in BEYOND_DIRECT.get(harness.suite.name, []):
        result = through.results.get(scenario)
        if result is None or not result.successes()[check]:
            lost[scenario] = [*lost.get(scenario, []), f"{check}: expected SUCCESS through bastion (beyond direct)"]
    assert not lost, (
        f"{len(lost)} scenario(s) lose checks through bastion ({label}) that pass directly:\n"
        f"{format_regressions(lost)}\n\nharness summary through bastion:\n"
        + "\n".join(through.summary[n] for n in sorted(through.summary))
        + f"\n\nbastion stderr (tail):\n{gateway.stderr()[-4000:]}")


# The 0.1.16 harness is a handshake-era client and its direct run is handshake-era, so bastion talks to that fixture
# in the same era: like is compared with like. (The SDK fixture also answers server/discover, so "auto" would
# pick modern.)
@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_every_direct_success_also_passes_through_bastion(
        transport: str, legacy_direct: Run, legacy_harness: Harness, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    conf = upstream(LEGACY, transport, "legacy", request)
    assert_no_regressions(legacy_direct, legacy_harness, conf, tmp_path, f"{transport} upstream")


# The 2026-07-28 scenarios through bastion to a 2026-07-28 upstream: pinned ("modern") and detected ("auto").
@pytest.mark.parametrize("era", ["modern", "auto"])
@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_every_direct_2026_07_28_success_also_passes_through_bastion(
        transport: str, era: str, modern_direct: Run, modern_harness: Harness, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    conf = upstream(MODERN, transport, era, request)
    assert_no_regressions(modern_direct, modern_harness, conf, tmp_path, f"{transport} upstream, era {era}")
