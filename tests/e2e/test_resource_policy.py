"""Resource policy through the running gateway: every spelling of a URI meets the same rules.

bastion runs ``tests.fixtures.files_server`` (prefix ``files``), which resolves URIs the way typical servers do
(``urlparse``, ``unquote``, ``normpath``), behind API-key authentication and a policy that is rewritten mid-test.
Clients are raw HTTP, where exact URIs and streams matter.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.auth.apikeys import hash_key
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient

ALICE_KEY = "bst_alice_" + "a" * 40
AUTH = {"Authorization": f"Bearer {ALICE_KEY}"}

OPEN = """\
version: 1
rules:
  - {id: eng, effect: allow, principals: {groups: [eng]}}
  - {id: no-secrets, effect: deny, resources: ["files+FILE:///srv/%73ecret/*"]}
"""


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayProcess]:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "rules.yaml").write_text(OPEN)
    process = GatewayProcess({
        "auth": {"api_keys": [{"id": "alice", "hash": hash_key(ALICE_KEY), "groups": ["eng"]}]},
        "upstreams": {"files": stdio_upstream("tests.fixtures.files_server", "--record",
                                              str(tmp_path / "upstream.jsonl"), prefix="files")},
        "policies": str(policies),
    }, tmp_path).start()
    yield process
    process.stop()


def upstream_saw(gw: GatewayProcess, key: str) -> list[Any]:
    path = gw.workdir / "upstream.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [doc[key] for doc in map(json.loads, lines) if key in doc]


# -- Defect: a deny list matched over non-canonical spellings ------------------------------------------------

SECRET_SPELLINGS = [
    "files+file:///srv/secret/key.pem",
    "files+FILE:///srv/secret/key.pem",
    "FILES+file:///srv/secret/key.pem",
    "files+file:///srv/%73ecret/key.pem",
    "files+file:///srv/%73%65cret/key%2epem",
    "files+file:///srv//secret/key.pem",
    "files+file:////srv/secret/key.pem",
    "files+file://localhost/srv/secret/key.pem",
    "files+file://LOCALHOST/srv/secret/key.pem",
    "files+file:/srv/secret/key.pem",
    "files+file:///srv/public/../secret/key.pem",
    "files+file:///srv/public/%2e%2e/secret/./key.pem",
    "files+file:///srv/./secret/key.pem",
]


def test_every_spelling_of_a_denied_uri_is_denied_and_allowed_ones_are_forwarded_canonical(
        gw: GatewayProcess) -> None:
    client = RpcClient(gw.url, AUTH)
    client.initialize()
    for uri in SECRET_SPELLINGS:
        answer = client.request("resources/read", {"uri": uri})
        assert answer.get("error", {}).get("message") == f"Resource not found: {uri}", (uri, answer)
    assert upstream_saw(gw, "read") == []  # none of them reached the upstream
    for uri in ["files+FILE://localhost/srv//public/./readme", "files+file:///srv/%70ublic/readme"]:
        assert client.request("resources/read", {"uri": uri})["result"]["contents"][0]["text"] == "hello"
    # The upstream is sent the canonical form that was judged, never the client's spelling.
    assert upstream_saw(gw, "read") == ["file:///srv/public/readme"] * 2
    client.close()


@pytest.mark.parametrize(("uri", "why"), [
    ("files+file:///srv/secret%2Fkey.pem", "encoded '/'"),
    ("files+file:///srv/%252e%252e/secret/key.pem", "encoded '%'"),
    ("files+file:///srv\\secret\\key.pem", "backslash"),
])
def test_uris_that_cannot_be_judged_are_refused_as_invalid(gw: GatewayProcess, uri: str, why: str) -> None:
    client = RpcClient(gw.url, AUTH)
    client.initialize()
    for method in ("resources/read", "resources/subscribe"):
        error = client.request(method, {"uri": uri})["error"]
        assert error["code"] == -32602 and error["message"].startswith("Invalid resource URI") \
            and why in error["message"], error
    assert upstream_saw(gw, "read") == [] and upstream_saw(gw, "subscribe") == []
    client.close()


def test_subscribing_to_another_spelling_of_a_denied_uri_is_refused(gw: GatewayProcess) -> None:
    client = RpcClient(gw.url, AUTH)
    client.initialize()
    for uri in SECRET_SPELLINGS:
        assert client.request("resources/subscribe", {"uri": uri})["error"]["message"].startswith(
            "Resource not found"), uri
    assert upstream_saw(gw, "subscribe") == []
    client.close()
