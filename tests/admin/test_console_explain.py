"""The console's explain form evaluates the principal the gateway authenticates: an API key's own groups and
attributes (which ``claims:`` rules match), a JWT subject from the claims entered; and it agrees with the gateway
itself, the console's catalogue and ``bastion policy explain --config``. The real gateway in-process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from bastion.auth.apikeys import hash_key
from bastion.auth.config import AuthConfig
from bastion.auth.known import PrincipalDirectory
from tests.admin.test_console import ADMIN_KEY, USER_KEY, alice_session, console, csrf_of, login

REPO = Path(__file__).resolve().parents[2]
CLAIMS_POLICY = """version: 1
rules:
  - id: eng-all
    effect: allow
    principals: {groups: [eng, admin]}
  - id: no-contractor-echo
    effect: deny
    principals:
      claims: {employment_type: contractor}
    tools: ["basic__echo"]
"""
KEYS = [{"id": "root", "hash": hash_key(ADMIN_KEY), "groups": ["admin"]},
        {"id": "alice", "hash": hash_key(USER_KEY), "groups": ["eng"],
         "attributes": {"employment_type": "contractor"}}]


async def explain(browser: httpx.AsyncClient, **fields: str) -> httpx.Response:
    token = csrf_of((await browser.get("/policy")).text)
    form = {"principal": "", "groups": "", "claims": "{}", "tool": "basic__echo", "arguments": "{}", **fields}
    return await browser.post("/policy/explain", data={**form, "csrf": token})


def decision(page: str) -> tuple[str, str]:
    found = re.search(r'id="decision">([^<]*)<.*?id="rule">([^<]*)<', page, re.S)
    assert found, page
    return found.group(1), found.group(2)


def source(page: str) -> str:
    found = re.search(r'id="principal-source" data-source="([^"]+)"', page)
    assert found, page
    return found.group(1)


def cli_explain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bastion", "policy", "explain", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


async def test_explain_uses_the_api_keys_attributes_as_the_gateway_catalogue_and_cli_do(tmp_path: Path) -> None:
    async with console(tmp_path, CLAIMS_POLICY, auth={"api_keys": KEYS}) as (door, browser):
        # The gateway: alice's key carries employment_type: contractor, and the claims rule denies her the tool.
        headers = await alice_session(door)
        await door.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "basic__echo", "arguments": {"message": "m"}}}, headers)
        call = door.records("tool.call")[-1]
        assert (call["decision"], call["rule_id"]) == ("deny", "no-contractor-echo")
        await login(browser)
        # The console's catalogue as seen by alice agrees.
        page = (await browser.get("/catalogue", params={"principal": "alice"})).text
        row = re.search(r'<tr data-tool="basic__echo" data-why="policy">.*?</tr>', page, re.S)
        assert row and "no-contractor-echo" in row.group(0)
        # So does the explain form, whatever groups or claims are typed in for an API key principal.
        for fields in ({"groups": "eng"}, {}, {"groups": "admin", "claims": '{"employment_type": "staff"}'}):
            r = await explain(browser, principal="alice", **fields)
            assert r.status_code == 200
            assert decision(r.text) == ("deny", "no-contractor-echo"), fields
            assert source(r.text) == "api_key"
            assert 'id="principal-groups">eng<' in r.text and "contractor" in r.text
        assert 'id="principal-ignored">groups, claims as entered' in r.text
        explained = [r for r in door.records("admin.action") if r["action"] == "policy.explain"]
        assert explained[-1]["detail"] == "principal 'alice' (api_key): deny"
        # And the CLI, given the gateway's config, resolves alice the same way (and without it, as given).
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "auth": {"api_keys": KEYS}, "policies": [str(tmp_path / "policy.yaml")],
            "upstreams": {"basic": {"command": [sys.executable, "-m", "tests.fixtures.basic_server"]}}}))
        out = cli_explain("--config", str(config), "--principal", "alice", "--tool", "basic__echo", "--json")
        assert out.returncode == 1, out.stderr
        data: dict[str, Any] = json.loads(out.stdout)
        assert (data["decision"], data["rule"]) == ("deny", "no-contractor-echo")
        assert data["principal"]["source"] == "api_key" and data["principal"]["groups"] == ["eng"]
        out = cli_explain("--config", str(config), "--principal", "alice", "--tool", "basic__echo")
        assert "from:          API key entry 'alice'" in out.stdout
        assert "rule:          no-contractor-echo" in out.stdout
        out = cli_explain("--policies", str(tmp_path / "policy.yaml"), "--principal", "alice", "--group", "eng",
                          "--tool", "basic__echo", "--json")
        assert json.loads(out.stdout)["principal"]["source"] == "entered"


async def test_explain_builds_a_jwt_subject_from_the_claims_entered(tmp_path: Path) -> None:
    auth = {"api_keys": KEYS[:1], "resource": "https://bastion.example/mcp",
            "authorization_servers": ["https://idp.example"],
            "jwt": {"issuer": "https://idp.example", "jwks_url": "http://127.0.0.1:9/jwks"}}
    async with console(tmp_path, CLAIMS_POLICY, auth=auth) as (door, browser):
        await login(browser)
        # As a verified token's claims: the groups claim gives groups, the other claims are attributes.
        r = await explain(browser, principal="carol", claims='{"groups": ["eng"], "employment_type": "contractor"}')
        assert decision(r.text) == ("deny", "no-contractor-echo") and source(r.text) == "jwt"
        r = await explain(browser, principal="carol", claims='{"groups": ["eng"], "employment_type": "staff"}')
        assert decision(r.text) == ("allow", "eng-all")
        r = await explain(browser, principal="carol", groups="eng", claims='{"employment_type": "contractor"}')
        assert decision(r.text) == ("deny", "no-contractor-echo")
        # Claims a token could not carry, or that are not an object, are refused, not guessed at.
        for claims in ('{"groups": 5}', "[1]", "{"):
            r = await explain(browser, principal="carol", claims=claims)
            assert r.status_code == 400 and 'id="decision"' not in r.text, claims
        assert [r["outcome"] for r in door.records("admin.action") if r["action"] == "policy.explain"][-3:] == \
            ["failed"] * 3


def test_the_directory_resolves_each_source_and_says_which() -> None:
    # Without auth every caller is the anonymous principal, whatever is entered.
    none = PrincipalDirectory.from_auth(AuthConfig.none())
    resolved = none.resolve("alice", groups=["eng"], claims={"employment_type": "staff"})
    assert resolved.principal.id == "anonymous" and resolved.source == "anonymous"
    assert resolved.ignored == ("principal id", "groups", "claims")
    assert [p.id for p in none.known] == ["anonymous"]
    # API keys only: an unknown id is evaluated as entered, and said to be no principal the gateway knows.
    keys = PrincipalDirectory.from_auth(AuthConfig.from_mapping({"api_keys": KEYS}, listen_host="127.0.0.1"))
    assert [p.id for p in keys.known] == ["alice", "root"]
    alice = keys.resolve("alice", groups=["eng"])
    assert alice.source == "api_key" and alice.ignored == () and alice.principal is keys.find("alice")
    assert dict(alice.principal.attributes) == {"employment_type": "contractor"}
    bob = keys.resolve("bob", groups=["eng"], claims={"employment_type": "staff"})
    assert bob.source == "entered" and bob.principal.groups == {"eng"}
    assert dict(bob.principal.attributes) == {"employment_type": "staff"}
