"""``bastion policy explain --config`` decides on the upstream the gateway routes a target to: the configured
prefix and separator, not a guess from the name. A rule's ``upstreams`` then means the same in both, for tools,
prompts and resources, and an admin is never told "deny" for what the gateway allows (or the reverse)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import REPO, GatewayProcess
from tests.support.rpc import RpcClient

POLICY = """\
version: 1
rules:
  - id: basic-for-all
    effect: allow
    upstreams: [basic]
  - id: no-add
    effect: deny
    upstreams: [basic]
    tools: [b.add]
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("explain")
    (workdir / "policies").mkdir()
    (workdir / "policies" / "rules.yaml").write_text(POLICY)
    # The upstream is published under another prefix than its name, with another separator than the default.
    gateway = GatewayProcess({"auth": "none", "catalogue": {"separator": "."}, "policies": str(workdir / "policies"),
                              "upstreams": {"basic": {**stdio_upstream(), "prefix": "b"}}}, workdir).start()
    yield gateway
    gateway.stop()


def run_explain(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    # This checkout's bastion, as the gateway runs it (the installed one may be another checkout's).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO / "src"), str(REPO)))}
    return subprocess.run([sys.executable, "-m", "bastion", "policy", "explain", "--config", str(gw.config_path),
                           "--principal", "anonymous", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def explain(gw: GatewayProcess, *target: str) -> dict[str, Any]:
    done = run_explain(gw, "--json", *target)
    assert done.returncode in (0, 1), done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.mark.parametrize(("target", "method", "params"), [
    (("--tool", "b.echo"), "tools/call", {"name": "b.echo", "arguments": {"message": "hi"}}),
    (("--tool", "b.add"), "tools/call", {"name": "b.add", "arguments": {"a": 1, "b": 2}}),
    (("--prompt", "b.greet"), "prompts/get", {"name": "b.greet", "arguments": {"language": "french"}}),
    (("--resource", "b+memo://readme"), "resources/read", {"uri": "b+memo://readme"}),
])
def test_explain_with_the_config_decides_as_the_gateway_does(gw: GatewayProcess, target: tuple[str, ...],
                                                            method: str, params: dict[str, Any]) -> None:
    client = RpcClient(gw.url)
    client.initialize()
    answer = client.request(method, params)
    enforced = "allow" if "result" in answer and not answer["result"].get("isError") else "deny"
    explained = explain(gw, *target)
    # Explain guessed the upstream from the name ("b.echo" has no "__": none), so `upstreams: [basic]` never
    # matched there: "deny" (default) for what the gateway allowed.
    assert explained["decision"] == enforced, (answer, explained)
    assert explained["upstream"] == "basic"


def test_a_name_no_configured_upstream_publishes_is_an_error_not_a_guess(gw: GatewayProcess) -> None:
    done = run_explain(gw, "--tool", "basic__echo")
    assert done.returncode == 2
    assert "no upstream of the config publishes tool 'basic__echo' (prefixes: b)" in done.stderr
