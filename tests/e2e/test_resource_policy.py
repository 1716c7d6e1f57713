"""Resource policy through the running gateway: every spelling of a URI meets the same rules, and what a client
subscribed to is authorised again at each delivery, on legacy GET streams and 2026-07-28 listen streams alike.

bastion runs ``tests.fixtures.files_server`` (prefix ``files``), which resolves URIs the way typical servers do
(``urlparse``, ``unquote``, ``normpath``), behind API-key authentication and a policy that is rewritten mid-test.
Clients are raw HTTP, where exact URIs and streams matter.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion.auth.apikeys import hash_key
from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT, RpcClient

ALICE_KEY = "bst_alice_" + "a" * 40
AUTH = {"Authorization": f"Bearer {ALICE_KEY}"}
V = "2026-07-28"

OPEN = """\
version: 1
rules:
  - {id: eng, effect: allow, principals: {groups: [eng]}}
  - {id: no-secrets, effect: deny, resources: ["files+FILE:///srv/%73ecret/*"]}
"""
CLOSED = """\
version: 1
rules:
  - {id: eng-tools, effect: allow, principals: {groups: [eng]}, tools: ["*"]}
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


# -- Defect: subscriptions surviving a policy reload that hides the resource ---------------------------------


class SseReader:
    """Reads one SSE response on a thread, keeping every JSON message."""

    def __init__(self, method: str, url: str, headers: dict[str, str], body: dict[str, Any] | None = None) -> None:
        self.messages: list[dict[str, Any]] = []
        self.opened = threading.Event()
        self._http = httpx.Client(timeout=httpx.Timeout(10, read=None))
        self._thread = threading.Thread(target=self._run, args=(method, url, headers, body), daemon=True)
        self._thread.start()
        assert self.opened.wait(10)

    def _run(self, method: str, url: str, headers: dict[str, str], body: dict[str, Any] | None) -> None:
        try:
            with self._http.stream(method, url, headers=headers,
                                   content=json.dumps(body) if body is not None else None) as response:
                self.opened.set()
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        self.messages.append(json.loads(line[5:]))
        except httpx.HTTPError:
            pass
        self.opened.set()

    def methods(self) -> list[str]:
        return [str(m.get("method")) for m in self.messages]

    def close(self) -> None:
        self._http.close()


def wait_for(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {check.__doc__ or ''}"
        time.sleep(0.05)


def test_a_reload_that_hides_a_resource_stops_its_updates_on_both_eras_streams(gw: GatewayProcess) -> None:
    uri = "files+file:///srv/public/readme"
    legacy = RpcClient(gw.url, AUTH)
    legacy.initialize()
    legacy.request("logging/setLevel", {"level": "info"})
    assert legacy.request("resources/subscribe", {"uri": uri})["result"] == {}
    get_stream = SseReader("GET", gw.url, {**AUTH, "Accept": "text/event-stream",
                                           "Mcp-Session-Id": str(legacy.session_id),
                                           "MCP-Protocol-Version": legacy.version})
    body = {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
            "params": {"notifications": {"resourceSubscriptions": [uri], "toolsListChanged": True},
                       "_meta": {"io.modelcontextprotocol/protocolVersion": V,
                                 "io.modelcontextprotocol/clientCapabilities": {}}}}
    listen = SseReader("POST", gw.url, {**AUTH, "Accept": ACCEPT, "Content-Type": "application/json",
                                        **request_headers("subscriptions/listen", body["params"], V)}, body)
    updated = "notifications/resources/updated"
    try:
        wait_for(lambda: "notifications/subscriptions/acknowledged" in listen.methods())
        # While the policy allows it, both streams get the update (and the GET stream the log message).
        assert legacy.call("files__touch", {"uris": ["file:///srv/public/readme"]})["result"]["content"]
        wait_for(lambda: updated in get_stream.methods() and updated in listen.methods()
                 and "notifications/message" in get_stream.methods())
        got = [m for m in listen.messages if m.get("method") == updated]
        assert got[0]["params"]["uri"] == uri

        rules: Path = gw.workdir / "policies" / "rules.yaml"
        rules.write_text(CLOSED)
        wait_for(lambda: legacy.request("resources/read", {"uri": uri}).get("error") is not None)
        assert legacy.request("resources/list")["result"]["resources"] == []
        before_get, before_listen = len(get_stream.messages), len(listen.messages)
        # The upstream still sends updates for it (and for another spelling of it), and still logs.
        assert legacy.call("files__touch", {"uris": ["file:///srv/public/readme", "FILE:///srv/public/readme"]})[
            "result"]["content"]
        # The upstream's log message, sent after the updates, is still for alice (she may see its tool): once it
        # is on the GET stream, the updates before it were dropped, not late.
        wait_for(lambda: get_stream.methods()[before_get:].count("notifications/message") >= 1)
        time.sleep(0.5)  # the listen stream has no later message to wait for: give a dropped update time to show
        assert updated not in get_stream.methods()[before_get:]
        assert updated not in listen.methods()[before_listen:]
    finally:
        get_stream.close()
        listen.close()
        legacy.close()
