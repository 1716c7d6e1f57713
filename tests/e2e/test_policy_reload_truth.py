"""Hot reload through the running gateway, told truthfully: a moment of half-changed files is never enforced, and
an error ends (in /readyz, the audit log) when the files read as the set in force again."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess

ALLOW = "version: 1\nrules:\n  - id: allow-all\n    effect: allow\n"
DENY = "version: 1\nrules:\n  - id: no-echo\n    effect: deny\n    tools: [basic__echo]\n"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("reload")
    policies = workdir / "policies"
    policies.mkdir()
    (policies / "10-allow.yaml").write_text(ALLOW)
    (policies / "20-deny.yaml").write_text(DENY)
    gateway = GatewayProcess({"auth": "none", "upstreams": {"basic": stdio_upstream()},
                              "policies": str(policies)}, workdir).start()
    yield gateway
    gateway.stop()


def _policy_status(gw: GatewayProcess) -> dict[str, object]:
    status: dict[str, object] = httpx.get(gw.base + "/readyz", timeout=5).json()["checks"]["policy"]
    return status


def _failing_gauge(gw: GatewayProcess) -> float:
    body = httpx.get(gw.base + "/metrics", timeout=5).text
    return next(float(line.split()[-1]) for line in body.splitlines()
                if line.startswith("bastion_policy_reload_failing "))


def _until(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_policy_files_gone_for_a_while_and_back_unchanged_end_the_error(gw: GatewayProcess) -> None:
    policies = gw.workdir / "policies"
    moved = gw.workdir / "policies.moved"
    version = _policy_status(gw)["version"]
    os.replace(policies, moved)
    _until(lambda: any(r["outcome"] == "rejected" for r in gw.records("policy.reload")), "no rejected record")
    assert _policy_status(gw)["ok"] is False
    assert _failing_gauge(gw) == 1
    os.replace(moved, policies)  # the very same files: same inodes, same times
    # The error stayed: /readyz said `ok: false` ("the policy files on disk are invalid") for as long as the
    # gateway ran, since the files read as the content last tried before the failure.
    _until(lambda: _policy_status(gw)["ok"] is True, "/readyz still reports the policy files as invalid")
    assert _policy_status(gw)["version"] == version
    assert _failing_gauge(gw) == 0
    recovered = [r for r in gw.records("policy.reload") if r["outcome"] == "unchanged"]
    assert [(r["digest"], r["rules"]) for r in recovered] == [(version, 2)]
    assert not [r for r in gw.records("policy.reload") if r["outcome"] == "applied"]
