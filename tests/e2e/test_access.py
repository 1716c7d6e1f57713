"""Authentication, access policy and rate limits through the running gateway, with two real principals."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bastion.auth.apikeys import hash_key
from tests.e2e.conftest import LEGACY, stdio_upstream
from tests.support.fixture_server import FixtureServer
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient

ALICE_KEY = "bst_alice_" + "a" * 40
BOB_KEY = "bst_bob_" + "b" * 40

POLICY = """\
version: 1
rules:
  - id: eng-basic
    effect: allow
    principals: {groups: [eng]}
    tools: ["basic__echo", "basic__add", "basic__whoami"]
    arguments:
      message: {type: string, max_length: 10, optional: true}
    limits:
      - {name: eng-echo, rate: 3/minute, burst: 3, per: principal_tool}
  - id: ops-web
    effect: allow
    principals: {groups: [ops]}
    upstreams: [web]
  - id: nobody-crashes
    effect: deny
    tools: ["*__crash"]
  - id: watch-fail
    effect: deny
    mode: shadow
    tools: ["web__fail"]
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, http_fixture: FixtureServer) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("secured")
    policies = workdir / "policies"
    policies.mkdir()
    (policies / "rules.yaml").write_text(POLICY)
    gw = GatewayProcess({
        "auth": {"api_keys": [{"id": "alice", "hash": hash_key(ALICE_KEY), "groups": ["eng"]},
                              {"id": "bob", "hash": hash_key(BOB_KEY), "groups": ["ops"]}]},
        "upstreams": {"basic": stdio_upstream(), "web": {"url": http_fixture.url, **LEGACY}},
        "policies": str(policies),
    }, workdir).start()
    gw.policy_dir = policies  # type: ignore[attr-defined]
    yield gw
    gw.stop()


def client(gw: GatewayProcess, key: str | None) -> RpcClient:
    return RpcClient(gw.url, {"Authorization": f"Bearer {key}"} if key else {})


def test_missing_or_wrong_credentials_get_401_with_a_challenge(secured: GatewayProcess) -> None:
    for key in (None, "bst_wrong_" + "c" * 40):
        c = client(secured, key)
        r = c.post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                               "clientInfo": {"name": "x", "version": "1"}}})
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")


def test_each_principal_sees_only_what_it_may_call(secured: GatewayProcess) -> None:
    alice, bob = client(secured, ALICE_KEY), client(secured, BOB_KEY)
    alice.initialize()
    bob.initialize()
    assert alice.tool_names() == ["basic__add", "basic__echo", "basic__whoami"]
    bob_tools = bob.tool_names()
    assert bob_tools and all(n.startswith("web__") for n in bob_tools)
    assert "web__crash" not in bob_tools  # the deny rule hides it

    assert alice.call("basic__echo", {"message": "hi"})["result"]["content"][0]["text"] == "hi"
    # Denied looks exactly like unknown.
    denied = alice.call("web__echo", {"message": "hi"})["error"]
    unknown = alice.call("web__does_not_exist", {})["error"]
    assert denied["code"] == unknown["code"] == -32602
    assert denied["message"] == "Unknown tool: web__echo"
    # An argument outside the policy's constraint is refused the same way.
    assert alice.call("basic__echo", {"message": "far too long for policy"})["error"]["code"] == -32602

    records = secured.wait_records("tool.call", 4)
    denial = next(r for r in records if r["tool"]["name"] == "web__echo")
    assert denial["decision"] == "deny"
    assert denial["stage"] == "policy"


def test_shadow_rule_is_audited_but_not_enforced(secured: GatewayProcess) -> None:
    bob = client(secured, BOB_KEY)
    bob.initialize()
    result = bob.call("web__fail", {})["result"]
    assert result["isError"] is True
    record = [r for r in secured.wait_records("tool.call", 1) if r["tool"]["name"] == "web__fail"][-1]
    assert "watch-fail" in record["shadow_denies"]
    assert record["decision"] == "allow"


def test_a_session_is_bound_to_the_principal_that_opened_it(secured: GatewayProcess) -> None:
    alice, bob = client(secured, ALICE_KEY), client(secured, BOB_KEY)
    alice.initialize()
    bob.session_id = alice.session_id
    r = bob.post({"jsonrpc": "2.0", "id": 5, "method": "tools/list"})
    assert r.status_code == 404


def test_client_credentials_never_reach_an_upstream(secured: GatewayProcess) -> None:
    bob = client(secured, BOB_KEY)
    bob.initialize()
    seen = bob.call("web__whoami", {})["result"]["structuredContent"]
    lowered = {k.lower(): v for k, v in seen.items()}
    assert "authorization" not in lowered
    assert "x-api-key" not in lowered
    assert BOB_KEY not in json.dumps(seen)


def test_rate_limit_from_the_policy_trips_with_retry_after(secured: GatewayProcess) -> None:
    alice = client(secured, ALICE_KEY)
    alice.initialize()
    answers = [alice.call("basic__add", {"a": 1, "b": i}) for i in range(5)]
    ok = [a for a in answers if "result" in a]
    limited = [a["error"] for a in answers if "error" in a]
    assert len(ok) == 3
    assert len(limited) == 2
    assert limited[0]["code"] == -31001
    assert limited[0]["data"]["limit"] == "eng-echo"
    assert limited[0]["data"]["retryAfter"] > 0
    record = [r for r in secured.wait_records("tool.call", 5) if r["outcome"] == "rate_limited"][-1]
    assert record["limit"] == "eng-echo"


def test_policy_hot_reload_applies_and_a_broken_edit_keeps_the_last_good(secured: GatewayProcess) -> None:
    bob = client(secured, BOB_KEY)
    bob.initialize()
    assert "basic__echo" not in bob.tool_names()
    rules: Path = secured.policy_dir / "rules.yaml"  # type: ignore[attr-defined]
    extra = "  - id: ops-echo\n    effect: allow\n    principals: {groups: [ops]}\n    tools: [basic__echo]\n"
    rules.write_text(POLICY + extra)
    deadline = time.monotonic() + 15
    while "basic__echo" not in bob.tool_names() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "basic__echo" in bob.tool_names()

    rules.write_text(POLICY + extra + "  - id: broken\n    effect: maybe\n")
    deadline = time.monotonic() + 15
    while "policy.reload_failed" not in secured.stderr() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "policy.reload_failed" in secured.stderr()
    assert "basic__echo" in bob.tool_names()
    reloads = secured.wait_records("policy.reload", 2)
    assert [r["outcome"] for r in reloads][-2:] == ["applied", "rejected"]
    assert "effect" in reloads[-1]["error"]
    # /readyz answers anyone: it says the files are broken, not what they contain or where they are.
    ready = httpx.get(secured.url.rsplit("/", 1)[0] + "/readyz", timeout=5).json()["checks"]["policy"]
    assert ready["ok"] is False and ready["error"]
    assert "maybe" not in json.dumps(ready) and "broken" not in json.dumps(ready) and "files" not in ready
    assert str(secured.workdir) not in json.dumps(ready)  # the policy files live under it
    rules.write_text(POLICY)
