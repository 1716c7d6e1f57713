"""The official MCP conformance harness against our fixture upstream, directly and through bastion.

Every server scenario of ``@modelcontextprotocol/conformance`` (pinned in ``.ci/conformance.sh``) runs against
``tests.fixtures.conformance_server`` over Streamable HTTP; the set of scenarios that are not clean there must be
exactly ``expected-failures-direct.yml``. Then the same scenarios run against bastion fronting that server
unprefixed, once as a stdio upstream and once as a Streamable HTTP upstream, and every check that succeeded
directly must succeed through bastion too. A failure prints, per scenario, the checks lost and the harness's
message for each.

The harness and a node >= 22 are installed from npm on first use into ``$PEERS_DIR`` (default
``~/.cache/bastion-peers``) and reused afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
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
from tests.support.gateway import REPO, GatewayProcess
from tests.support.net import free_port, wait_for_port

SCRIPT = REPO / ".ci" / "conformance.sh"
BASELINE = Path(__file__).with_name("expected-failures-direct.yml")
SCENARIO_TIMEOUT = 20
# Scenarios are independent (each opens its own MCP session), so a few harness processes share the run; this
# bounds the worst case (every scenario hanging) to len/WORKERS * SCENARIO_TIMEOUT.
WORKERS = 4
INSTALL_TIMEOUT = 900
LIST_RE = re.compile(r"^  - (\S+)")


@dataclass(frozen=True, slots=True)
class Run:
    results: dict[str, Scenario]
    summary: dict[str, str]
    stdout: str


def peers_dir() -> str:
    return os.environ.get("PEERS_DIR") or str(Path.home() / ".cache" / "bastion-peers")


@pytest.fixture(scope="module")
def harness_env() -> dict[str, str]:
    env = {**os.environ, "PEERS_DIR": peers_dir(), "SCENARIO_TIMEOUT": str(SCENARIO_TIMEOUT)}
    done = subprocess.run(["bash", str(SCRIPT), "--install"], env=env, capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT, check=False)
    assert done.returncode == 0, f"installing the conformance harness failed:\n{done.stdout}\n{done.stderr}"
    env["CONFORMANCE_NODE"] = done.stdout.strip().splitlines()[-1]
    return env


@pytest.fixture(scope="module")
def scenarios(harness_env: dict[str, str]) -> list[str]:
    done = subprocess.run(["bash", str(SCRIPT), "--list"], env=harness_env, capture_output=True, text=True,
                          timeout=120, check=False)
    names = [m[1] for line in done.stdout.splitlines() if (m := LIST_RE.match(line))]
    assert names, f"the harness listed no server scenarios:\n{done.stdout}\n{done.stderr}"
    return names


def run_harness(url: str, out_dir: Path, names: list[str], env: dict[str, str]) -> Run:
    chunks = [names[i::WORKERS] for i in range(WORKERS) if names[i::WORKERS]]

    def one(chunk: list[str]) -> str:
        args = ["bash", str(SCRIPT), url]
        for name in chunk:
            args += ["--scenario", name]
        done = subprocess.run(args, env={**env, "CONFORMANCE_OUT": str(out_dir)}, capture_output=True, text=True,
                              timeout=len(chunk) * (SCENARIO_TIMEOUT + 10) + 60, check=False)
        return done.stdout + done.stderr

    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        stdout = "\n".join(pool.map(one, chunks))
    return Run(load_results(out_dir), parse_summary(stdout), stdout)


class FixtureServer:
    """tests.fixtures.conformance_server over Streamable HTTP on a free loopback port."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / f"conformance-server-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.conformance_server", "--transport", "streamable-http",
             "--port", str(self.port)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=self.log.open("wb"))
        wait_for_port(self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def fixture_server(tmp_path: Path) -> Iterator[FixtureServer]:
    server = FixtureServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def direct(tmp_path_factory: pytest.TempPathFactory, harness_env: dict[str, str], scenarios: list[str]) -> Run:
    workdir = tmp_path_factory.mktemp("conformance-direct")
    server = FixtureServer(workdir)
    try:
        return run_harness(server.url, workdir / "out", scenarios, harness_env)
    finally:
        server.stop()


def test_fixture_passes_every_scenario_but_the_baseline(direct: Run, scenarios: list[str]) -> None:
    missing = sorted(set(scenarios) - set(direct.results))
    assert not missing, f"no checks.json for {missing}:\n{direct.stdout}"
    expected = load_baseline(BASELINE)
    failing = unclean(direct.results)
    assert failing == expected, (
        f"not clean directly but not in {BASELINE.name}: {sorted(failing - expected)}; "
        f"in {BASELINE.name} but clean now: {sorted(expected - failing)}\n{direct.stdout}")
    # The comparison below is only meaningful if the direct run proves something in every scenario.
    assert all(direct.results[name].successes() for name in set(scenarios) - expected)


# The harness is a handshake-era client and the direct run is handshake-era, so bastion talks to the fixture in that
# era too: like is compared with like. (The SDK fixture also answers server/discover, so "auto" would pick modern.)
ERA = "legacy"


def stdio_upstream() -> dict[str, Any]:
    return {"command": [sys.executable, "-m", "tests.fixtures.conformance_server", "--transport", "stdio"],
            "cwd": str(REPO), "prefix": None, "era": ERA}


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_every_direct_success_also_passes_through_bastion(
        transport: str, direct: Run, scenarios: list[str], harness_env: dict[str, str], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    if transport == "stdio":
        upstream = stdio_upstream()
    else:
        upstream = {"url": request.getfixturevalue("fixture_server").url, "prefix": None, "era": ERA}
    gateway = GatewayProcess({"listen": {"path": "/mcp"}, "auth": "none", "upstreams": {"conf": upstream}},
                             tmp_path).start()
    try:
        through = run_harness(gateway.url, tmp_path / "out", scenarios, harness_env)
    finally:
        gateway.stop()
    lost = regressions(direct.results, through.results, through.summary)
    assert not lost, (
        f"{len(lost)} scenario(s) lose checks through bastion ({transport} upstream) that pass directly:\n"
        f"{format_regressions(lost)}\n\nharness summary through bastion:\n"
        + "\n".join(through.summary[n] for n in sorted(through.summary))
        + f"\n\nbastion stderr (tail):\n{gateway.stderr()[-4000:]}")
