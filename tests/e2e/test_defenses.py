"""Hostile schemas, poisoned output and changing tools, through the running gateway."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.result import sanitize_result
from bastion.server.dispatch import map_result_uris
from tests.e2e.conftest import stdio_upstream
from tests.fixtures import hostile_server, poison_server
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient


@pytest.fixture(scope="module")
def defended(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("defended")
    gw = GatewayProcess({
        "auth": "none",
        "upstreams": {
            "hostile": stdio_upstream("tests.fixtures.hostile_server", "--record", str(workdir / "hostile.jsonl")),
            "poison": stdio_upstream("tests.fixtures.poison_server"),
            "basic": stdio_upstream("tests.fixtures.basic_server"),
        },
        "pinning": {"file": str(workdir / "pins.json")},
        "catalogue": {"refresh_interval": "1s"},  # so an approval made with the CLI shows up quickly
        "audit": {"sinks": ["stdout", {"file": str(workdir / "audit.jsonl")}]},
    }, workdir).start()
    gw.workdir_path = workdir  # type: ignore[attr-defined]
    yield gw
    gw.stop()


def map_uris(result: dict[str, object]) -> dict[str, object]:
    return map_result_uris(dict(result), "poison")


def received_calls(gw: GatewayProcess) -> list[dict[str, object]]:
    """What the hostile upstream recorded receiving."""
    path: Path = gw.workdir_path / "hostile.jsonl"  # type: ignore[attr-defined]
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def rpc(defended: GatewayProcess) -> Iterator[RpcClient]:
    c = RpcClient(defended.url)
    c.initialize()
    yield c
    c.close()


def test_hostile_schemas_quarantine_their_tools(rpc: RpcClient, defended: GatewayProcess) -> None:
    names = set(rpc.tool_names())
    for tool in hostile_server.QUARANTINED:
        assert f"hostile__{tool}" not in names
        assert rpc.call(f"hostile__{tool}", {})["error"]["code"] == -32602
    for tool in hostile_server.USABLE:
        assert f"hostile__{tool}" in names
    assert "validation.tool_quarantined" in defended.stderr()
    assert not {call["name"] for call in received_calls(defended)} & hostile_server.QUARANTINED


def test_invalid_arguments_never_reach_the_upstream(rpc: RpcClient, defended: GatewayProcess) -> None:
    result = rpc.call("hostile__catastrophic_regex", {"text": "a" * 30_000 + "!"})["result"]
    assert result["isError"] is True
    assert "Invalid arguments" in result["content"][0]["text"]
    rich = rpc.call("hostile__rich", {"unexpected": True})["result"]
    assert rich["isError"] is True
    assert not [c for c in received_calls(defended) if c["name"] in ("catastrophic_regex", "rich")]


def test_violating_output_is_withheld_and_errors_pass_untouched(rpc: RpcClient) -> None:
    bad = rpc.call("hostile__bad_output", {})["result"]
    assert bad["isError"] is True
    assert hostile_server.LEAKED_SECRET not in json.dumps(bad)
    missing = rpc.call("hostile__no_structured", {})["result"]
    assert missing["isError"] is True
    passed = rpc.call("hostile__error_output", {})["result"]
    assert passed["isError"] is True
    assert passed["structuredContent"] == {"count": -1}


@pytest.mark.parametrize("tool", [*poison_server.PAYLOADS, "structured", "binary"])
def test_poisoned_results_arrive_exactly_as_the_sanitizer_defines(rpc: RpcClient, tool: str) -> None:
    received = rpc.call(f"poison__{tool}", {})["result"]
    expected, _ = sanitize_result(poison_server.result_for(tool, {}), SanitizeConfig.from_mapping(None)
                                  .for_tool("poison", tool))
    assert json.dumps(received, sort_keys=True) == json.dumps(map_uris(expected), sort_keys=True)
    text = json.dumps(received, ensure_ascii=False)
    for hidden in ("\x1b", "\u202e", "\u200b", "\U000e0069"):
        assert hidden not in text
    for secret in poison_server.FAKE.values():
        assert secret not in text


def test_poisoned_definitions_are_cleaned_before_clients_see_them(rpc: RpcClient) -> None:
    tools = {t["name"]: t for t in rpc.request("tools/list")["result"]["tools"]}
    add = tools["poison__add"]
    dumped = json.dumps(add, ensure_ascii=False)
    assert "\U000e0069" not in dumped
    assert "\u202e" not in dumped


def test_a_changed_tool_definition_is_quarantined_until_approved(rpc: RpcClient, defended: GatewayProcess) -> None:
    assert "basic__echo" in rpc.tool_names()
    assert rpc.call("basic__mutate", {})["result"]["content"][0]["text"] == "mutated"
    deadline = time.monotonic() + 15
    while "basic__echo" in rpc.tool_names() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "basic__echo" not in rpc.tool_names()
    assert rpc.call("basic__echo", {"message": "x"})["error"]["code"] == -32602
    drift = defended.wait_records("pin.drift", 1)
    assert drift
    assert drift[-1]["tool"] == "echo"
    assert drift[-1]["action"] == "blocked"

    # The admin's side, with the real CLI against the gateway's own config.
    cli = [sys.executable, "-m", "bastion", "pins"]
    config = ["--config", str(defended.config_path)]
    listed = subprocess.run([*cli, "list", "--status", "quarantined", *config], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "echo" in listed.stdout
    diff = subprocess.run([*cli, "diff", "basic", "echo", *config], capture_output=True, text=True, timeout=60)
    assert "~/.ssh/id_rsa" in diff.stdout
    approved = subprocess.run([*cli, "approve", "basic", "echo", "--by", "admin", *config], capture_output=True,
                              text=True, timeout=60)
    assert approved.returncode == 0, approved.stderr
    audit_file: Path = defended.workdir_path / "audit.jsonl"  # type: ignore[attr-defined]
    approvals = [json.loads(line) for line in audit_file.read_text().splitlines() if '"pin.approve"' in line]
    assert approvals
    assert (approvals[-1]["tool"], approvals[-1]["approved_by"]) == ("echo", "admin")
    deadline = time.monotonic() + 20
    while "basic__echo" not in rpc.tool_names() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rpc.call("basic__echo", {"message": "approved"})["result"]["content"][0]["text"] == "approved"
