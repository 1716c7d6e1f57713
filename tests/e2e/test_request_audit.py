"""One ``request`` audit record for every forwarded request other than ``tools/call``, whatever its end, in both
eras, written before the client has its answer.

A real gateway, real fixture upstreams over stdio: ``basic`` (prompts, resources, completions, subscriptions),
``slow`` (the stubborn server, which ignores cancellation, with a one-second upstream timeout) and ``stuck`` (the
same server with the default timeout, to be cancelled or killed mid-request). A policy allows the caller
everything except one resource, which is then hidden: answered as a missing one, recorded as a denial.

The records an answered request wrote are read right after the answer, without waiting: each was on disk first.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion.auth.apikeys import hash_key
from tests.e2e.conftest import stdio_upstream
from tests.e2e.test_disconnect import hang_up, modern, wait_for
from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT, RpcClient, parse_body

KEY = "key-alice-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
POLICY = """\
version: 1
rules:
  - id: alice-all
    effect: allow
    principals: {ids: [alice]}
  - id: no-secret-notes
    effect: deny
    resources: ['basic+memo://notes/secret']
"""
ERAS = ("legacy", "modern")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("request-audit")
    policies = workdir / "policies"
    policies.mkdir()
    (policies / "rules.yaml").write_text(POLICY)
    for name in ("basic", "slow", "stuck"):
        (workdir / f"{name}.jsonl").touch()
    g = GatewayProcess({
        "auth": {"api_keys": [{"id": "alice", "hash": hash_key(KEY)}]},
        "policies": str(policies),
        "upstreams": {
            "basic": stdio_upstream("tests.fixtures.basic_server", "--record", str(workdir / "basic.jsonl")),
            "slow": stdio_upstream("tests.fixtures.stubborn_server", "--record", str(workdir / "slow.jsonl"),
                                   timeout="1s"),
            "stuck": stdio_upstream("tests.fixtures.stubborn_server", "--record", str(workdir / "stuck.jsonl")),
        },
    }, workdir).start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def legacy(gw: GatewayProcess) -> Iterator[RpcClient]:
    client = RpcClient(gw.url, AUTH)
    client.initialize()
    yield client
    client.close()


class Ask:
    """One request in either era, with an id of the test's choosing, and the records it left."""

    def __init__(self, gw: GatewayProcess, legacy: RpcClient) -> None:
        self.gw = gw
        self.legacy = legacy

    def __call__(self, era: str, rid: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if era == "legacy":
            body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
            answers = [m for m in parse_body(self.legacy.post(body)) if m.get("id") == rid]
        else:
            body, headers = modern(method, params, ACCEPT, 0)
            body["id"] = rid
            r = httpx.post(self.gw.url, content=json.dumps(body), timeout=30,
                           headers={**headers, **AUTH, "Content-Type": "application/json"})
            answers = [m for m in parse_body(r) if m.get("id") == rid]
        assert answers, f"no answer to {method}"
        return answers[-1]

    def records(self, rid: str) -> list[dict[str, Any]]:
        return [r for r in self.gw.records("request") if r["request_id"] == rid]


@pytest.fixture
def ask(gw: GatewayProcess, legacy: RpcClient) -> Ask:
    return Ask(gw, legacy)


def only(records: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(records) == 1, records
    return records[0]


def verdict(record: dict[str, Any]) -> tuple[Any, ...]:
    return record["method"], record["decision"], record["outcome"], record["stage"]


@pytest.mark.parametrize("era", ERAS)
def test_answered_requests_are_recorded_with_their_target_and_what_went_back(ask: Ask, era: str) -> None:
    cases = [
        ("prompts/get", {"name": "basic__greet", "arguments": {"language": "french"}},
         {"name": "basic__greet", "uri": None, "upstream": "basic", "original": "greet"}, 1),
        ("resources/read", {"uri": "basic+memo://notes/7"},
         {"name": None, "uri": "basic+memo://notes/7", "upstream": "basic", "original": "memo://notes/7"}, 1),
        ("completion/complete", {"ref": {"type": "ref/prompt", "name": "basic__greet"},
                                 "argument": {"name": "language", "value": "e"}},
         {"name": "basic__greet", "uri": None, "upstream": "basic", "original": "greet"}, 2),
    ]
    for n, (method, params, target, items) in enumerate(cases):
        rid = f"ok-{era}-{n}"
        answer = ask(era, rid, method, params)
        assert "result" in answer, answer
        record = only(ask.records(rid))  # on disk before the answer came back
        assert verdict(record) == (method, "allow", "allowed", "complete")
        assert record["target"] == target
        assert (record["era"], record["principal"]["id"], record["error"]) == (era, "alice", None)
        assert record["result"]["items"] == items and record["result"]["bytes"] > 0
        assert record["result"]["digest"].startswith("sha256:")
        assert record["latency_ms"]["upstream"] is not None
        assert (record["session"] is None) == (era == "modern")


def test_legacy_subscriptions_are_recorded_both_ways(ask: Ask) -> None:
    for method in ("resources/subscribe", "resources/unsubscribe"):
        rid = f"sub-{method}"
        assert "result" in ask("legacy", rid, method, {"uri": "basic+memo://readme"})
        record = only(ask.records(rid))
        assert verdict(record) == (method, "allow", "allowed", "complete")
        assert record["target"]["uri"] == "basic+memo://readme" and record["session"] is not None


@pytest.mark.parametrize("era", ERAS)
def test_unknown_and_hidden_targets_are_recorded_as_denials_answered_alike(ask: Ask, era: str) -> None:
    hidden = ask(era, f"hidden-{era}", "resources/read", {"uri": "basic+memo://notes/secret"})
    unknown = ask(era, f"unknown-{era}", "resources/read", {"uri": "nowhere+memo://nothing"})
    # The client learns nothing new: the same error for a hidden resource as for a missing one.
    assert hidden["error"]["code"] == unknown["error"]["code"] == -32602
    assert hidden["error"]["message"].replace("notes/secret", "X") == \
        unknown["error"]["message"].replace("nowhere+memo://nothing", "basic+memo://X")
    hidden_record = only(ask.records(f"hidden-{era}"))
    unknown_record = only(ask.records(f"unknown-{era}"))
    for record in (hidden_record, unknown_record):
        assert verdict(record) == ("resources/read", "deny", "denied", "resolve")
        assert record["result"] is None and record["latency_ms"]["upstream"] is None
    assert hidden_record["reason"] == "resource not visible to the caller"
    assert hidden_record["target"]["uri"] == "basic+memo://notes/secret"
    assert unknown_record["reason"] == "unknown resource"
    prompt = ask(era, f"noprompt-{era}", "prompts/get", {"name": "basic__nope"})
    assert prompt["error"]["message"] == "Unknown prompt: basic__nope"
    record = only(ask.records(f"noprompt-{era}"))
    assert verdict(record) == ("prompts/get", "deny", "denied", "resolve")
    assert record["target"] == {"name": "basic__nope", "uri": None, "upstream": None, "original": None}
    malformed = ask(era, f"malformed-{era}", "resources/read", {"uri": 7})
    assert "error" in malformed
    assert verdict(only(ask.records(f"malformed-{era}"))) == ("resources/read", "deny", "invalid_input", "parse")


@pytest.mark.parametrize("era", ERAS)
def test_upstream_errors_and_timeouts_are_recorded(ask: Ask, era: str) -> None:
    # The stubborn server answers completion/complete with "Method not found".
    failed = ask(era, f"uperr-{era}", "completion/complete",
                 {"ref": {"type": "ref/prompt", "name": "slow__stubborn"}, "argument": {"name": "tag", "value": ""}})
    assert "error" in failed
    record = only(ask.records(f"uperr-{era}"))
    assert verdict(record) == ("completion/complete", "error", "upstream_error", "forward")
    assert record["error"]["code"] == failed["error"]["code"]
    # Its prompt sleeps past the upstream's one-second timeout.
    late = ask(era, f"timeout-{era}", "prompts/get",
               {"name": "slow__stubborn", "arguments": {"seconds": "3", "tag": f"t-{era}"}})
    assert "error" in late
    record = only(ask.records(f"timeout-{era}"))
    assert verdict(record) == ("prompts/get", "error", "timeout", "forward")
    # The upstream timeout (1 s) was waited out; its clock and the record's differ by their start by a few µs.
    assert record["target"]["upstream"] == "slow" and record["latency_ms"]["upstream"] >= 900


def started(gw: GatewayProcess, upstream: str, tag: str) -> bool:
    lines = (gw.workdir / f"{upstream}.jsonl").read_text().splitlines()
    return any(json.loads(line).get("start") == tag for line in lines)


def test_a_legacy_request_the_client_cancels_is_recorded(gw: GatewayProcess, legacy: RpcClient, ask: Ask) -> None:
    answers: list[dict[str, Any]] = []
    params = {"name": "stuck__stubborn", "arguments": {"seconds": "2", "tag": "cancel-legacy"}}
    waiter = threading.Thread(target=lambda: answers.append(ask("legacy", "cancel-legacy", "prompts/get", params)))
    waiter.start()
    wait_for(lambda: started(gw, "stuck", "cancel-legacy"))
    legacy.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "cancel-legacy"}})
    waiter.join(30)
    record = only(gw.wait_records("request", 1) and ask.records("cancel-legacy"))
    assert verdict(record) == ("prompts/get", "error", "client_disconnected", "forward")


def test_a_legacy_request_reusing_an_id_in_flight_is_recorded_apart(gw: GatewayProcess, ask: Ask) -> None:
    answers: list[dict[str, Any]] = []
    params = {"name": "stuck__stubborn", "arguments": {"seconds": "1", "tag": "dup-first"}}
    first = threading.Thread(target=lambda: answers.append(ask("legacy", "dup", "prompts/get", params)))
    first.start()
    wait_for(lambda: started(gw, "stuck", "dup-first"))
    second = ask("legacy", "dup", "prompts/get", {"name": "basic__greet", "arguments": {"language": "x"}})
    assert second["error"]["code"] == -32600, second
    refused = only(ask.records("dup"))
    assert verdict(refused) == ("prompts/get", "deny", "invalid_input", "parse")
    assert refused["target"]["name"] == "basic__greet" and refused["session"] is not None
    first.join(30)
    assert "result" in answers[0]
    assert sorted(r["outcome"] for r in ask.records("dup")) == ["allowed", "invalid_input"]


def test_a_modern_request_whose_client_hangs_up_is_recorded(gw: GatewayProcess, ask: Ask) -> None:
    body, headers = modern("prompts/get", {"name": "stuck__stubborn",
                                           "arguments": {"seconds": "2", "tag": "hangup-modern"}}, ACCEPT, 0)
    body["id"] = "hangup-modern"
    hang_up(gw, body, {**headers, **AUTH})
    wait_for(lambda: bool(ask.records("hangup-modern")))
    record = only(ask.records("hangup-modern"))
    assert verdict(record) == ("prompts/get", "error", "client_disconnected", "forward")
    assert record["era"] == "modern"


def upstream_pid(gw: GatewayProcess, module: str, record: str) -> int:
    """The pid of the upstream process running ``module`` with ``record``: a child of the gateway."""
    assert gw.proc is not None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == gw.proc.pid and module.encode() in cmdline and record.encode() in cmdline:
            return int(entry.name)
    raise AssertionError(f"no {module} process")


@pytest.mark.parametrize("era", ERAS)
def test_a_request_whose_upstream_dies_is_recorded(gw: GatewayProcess, ask: Ask, era: str) -> None:
    tag = f"dies-{era}"
    answers: list[dict[str, Any]] = []
    params = {"name": "stuck__stubborn", "arguments": {"seconds": "30", "tag": tag}}
    waiter = threading.Thread(target=lambda: answers.append(ask(era, tag, "prompts/get", params)))
    waiter.start()
    wait_for(lambda: started(gw, "stuck", tag))
    os.kill(upstream_pid(gw, "tests.fixtures.stubborn_server", str(gw.workdir / "stuck.jsonl")), signal.SIGKILL)
    waiter.join(30)
    assert answers and answers[0]["error"]["code"] == -31002, answers
    record = only(ask.records(tag))
    assert verdict(record) == ("prompts/get", "error", "upstream_unavailable", "forward")
    # The next test needs the upstream back (bastion restarts it).
    deadline = time.monotonic() + 30
    quick = {"name": "stuck__stubborn", "arguments": {"seconds": "0", "tag": "probe"}}
    while time.monotonic() < deadline and "result" not in ask.legacy.request("prompts/get", quick):
        time.sleep(0.2)
