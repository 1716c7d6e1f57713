"""Through the running gateway: one principal cannot lock others out of sessions (``sessions.max_per_principal``),
and a GET stream ends with its session, whichever way the session ends (eviction, expiry, DELETE through another
replica, the JWT it was opened with expiring); every stream (GET or ``subscriptions/listen``) ends when the
credential it was opened with stops authenticating."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import redis

from bastion.auth.apikeys import hash_key
from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.jwks import JwksServer, rsa_pair
from tests.support.net import free_port
from tests.support.redis_server import RedisServer
from tests.support.rpc import RpcClient

MODERN = "2026-07-28"
ALICE = "bst_alice_" + "a" * 40
BOB = "bst_bob_" + "b" * 40
KEYS = {"auth": {"api_keys": [{"id": "alice", "hash": hash_key(ALICE)}, {"id": "bob", "hash": hash_key(BOB)}]}}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Stream:
    """A session's GET stream (or, with ``listen``, a 2026-07-28 ``subscriptions/listen``) read on a thread: what
    arrived, and when the gateway ended it."""

    def __init__(self, url: str, session_id: str, headers: dict[str, str], *, listen: bool = False) -> None:
        self.lines: list[str] = []
        self.status: int | None = None
        self.ended_at: float | None = None
        self._opened = threading.Event()
        self._client = httpx.Client(timeout=httpx.Timeout(60.0, read=60.0))
        self._method, self._body = "GET", b""
        self._headers = {**headers, "Accept": "text/event-stream", "Mcp-Session-Id": session_id,
                         "MCP-Protocol-Version": "2025-11-25"}
        if listen:
            params = {"notifications": {"toolsListChanged": True}, "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}}
            self._method = "POST"
            self._body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": params})
            self._headers = {**headers, "Accept": "application/json, text/event-stream",
                             "Content-Type": "application/json",
                             **request_headers("subscriptions/listen", params, MODERN)}
        self._thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self._thread.start()
        assert self._opened.wait(10), "the stream did not open"
        assert self.status == 200

    def _read(self, url: str) -> None:
        try:
            with self._client.stream(self._method, url, headers=self._headers, content=self._body) as r:
                self.status = r.status_code
                self._opened.set()
                for line in r.iter_lines():
                    self.lines.append(line)
        except httpx.HTTPError:
            pass
        finally:
            self.ended_at = time.monotonic()
            self._opened.set()

    def wait_end(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return self.ended_at is not None

    def close(self) -> None:
        self._client.close()


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess({**KEYS, "upstreams": {"basic": stdio_upstream()},
                              "sessions": {"max_per_principal": 3, "max_sessions": 8, "idle_timeout": "3s",
                                           "sweep_interval": "200ms"}}, tmp_path).start()
    yield gateway
    gateway.stop()


@pytest.fixture
def roomy_gw(tmp_path: Path) -> Iterator[GatewayProcess]:
    """As ``gw``, but no session idles out during a test: eviction, not expiry, is what ends one here (20 handshakes
    on a loaded machine can take longer than ``gw``'s 3 s idle timeout, which would end Bob's session too)."""
    gateway = GatewayProcess({**KEYS, "upstreams": {"basic": stdio_upstream()},
                              "sessions": {"max_per_principal": 3, "max_sessions": 8, "idle_timeout": "10m"}},
                             tmp_path).start()
    yield gateway
    gateway.stop()


def test_a_principal_past_its_quota_ends_its_own_oldest_session_never_anyone_elses(roomy_gw: GatewayProcess) -> None:
    gw = roomy_gw
    bob = RpcClient(gw.url, bearer(BOB))
    bob.initialize()
    first = RpcClient(gw.url, bearer(ALICE))
    first.initialize()
    stream = Stream(gw.url, first.session_id or "", bearer(ALICE))
    try:
        later = []
        for _ in range(20):  # far past the quota and the table's size
            c = RpcClient(gw.url, bearer(ALICE))
            c.initialize()
            later.append(c)
        assert stream.wait_end(5), "the evicted session's stream stayed open"
        assert first.post({"jsonrpc": "2.0", "id": 9, "method": "ping"}).status_code == 404
        assert [c.post({"jsonrpc": "2.0", "id": 9, "method": "ping"}).status_code for c in later[-3:]] == [200] * 3
        assert later[-4].post({"jsonrpc": "2.0", "id": 9, "method": "ping"}).status_code == 404
        # Another principal was never locked out, nor lost its session.
        assert bob.post({"jsonrpc": "2.0", "id": 9, "method": "ping"}).status_code == 200
        for _ in range(2):
            assert "protocolVersion" in RpcClient(gw.url, bearer(BOB)).initialize()
        ends = gw.wait_records("session.end", 18)
        assert {r["reason"] for r in ends} == {"evicted"}
        assert first.session_id in {r["session"] for r in ends}
        assert bob.session_id not in {r["session"] for r in ends}
    finally:
        stream.close()


def test_an_expired_sessions_stream_closes(gw: GatewayProcess) -> None:
    client = RpcClient(gw.url, bearer(ALICE))
    client.initialize()
    opened = time.monotonic()
    stream = Stream(gw.url, client.session_id or "", bearer(ALICE))
    try:
        assert stream.wait_end(10), "the expired session's stream stayed open"
        assert stream.ended_at is not None and stream.ended_at - opened >= 3.0  # the stream is not a use
        ends = gw.wait_records("session.end", 1)
        assert [(r["session"], r["reason"]) for r in ends] == [(client.session_id, "expired")]
        assert client.post({"jsonrpc": "2.0", "id": 9, "method": "ping"}).status_code == 404
    finally:
        stream.close()


@pytest.fixture
def replicas(tmp_path: Path, redis_server: RedisServer) -> Iterator[list[GatewayProcess]]:
    # A database of its own, emptied first: alice's sessions left by other modules' gateways (with another
    # idle_timeout) would count against her quota here.
    url = redis_server.url.replace("/0", "/7")
    redis.Redis.from_url(url).flushdb()
    config: dict[str, Any] = {
        **KEYS, "redis": {"url": url}, "upstreams": {"basic": stdio_upstream()},
        "sessions": {"max_per_principal": 2, "idle_timeout": "4s"}}
    gws = [GatewayProcess(config, tmp_path).start(), GatewayProcess(config, tmp_path).start()]
    yield gws
    for g in gws:
        g.stop()


def test_a_session_ended_through_another_replica_closes_its_stream_within_a_tick(
        replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    deleted, evicted = RpcClient(a.url, bearer(ALICE)), RpcClient(a.url, bearer(ALICE))
    deleted.initialize()
    evicted.initialize()
    # Kept in use so they never expire; both streams are held by replica b.
    streams = [Stream(b.url, c.session_id or "", bearer(ALICE)) for c in (deleted, evicted)]
    try:
        ended = time.monotonic()
        assert deleted.http.delete(a.url, headers={**bearer(ALICE), "Mcp-Session-Id": deleted.session_id or "",
                                                   "MCP-Protocol-Version": "2025-11-25"}).status_code == 200
        assert streams[0].wait_end(4), "a DELETE through replica a left the stream on b open"
        assert streams[0].ended_at is not None and streams[0].ended_at - ended < 3.0  # one tick: idle_timeout / 2
        for _ in range(2):  # past alice's quota of 2, through replica a
            RpcClient(a.url, bearer(ALICE)).initialize()
        assert streams[1].wait_end(4), "an eviction through replica a left the stream on b open"
        assert [r["reason"] for r in a.wait_records("session.end", 2)] == ["deleted", "evicted"]
    finally:
        for s in streams:
            s.close()


def test_a_principal_past_its_bound_of_listen_streams_ends_its_own_oldest(gw: GatewayProcess) -> None:
    """2026-07-28 listen streams have no session, and nothing bounded them: one principal held as many as it
    opened (300 in a loop, each with its upstream subscriptions). Now ``sessions.max_per_principal`` (3 here)
    bounds them per replica as it bounds sessions: the fourth ends the principal's oldest, nobody else's."""
    alice = [Stream(gw.url, "", bearer(ALICE), listen=True)]
    bob = Stream(gw.url, "", bearer(BOB), listen=True)
    alice += [Stream(gw.url, "", bearer(ALICE), listen=True) for _ in range(3)]
    try:
        assert alice[0].wait_end(10), "alice's oldest listen stream is still open"
        time.sleep(0.5)
        assert [s.ended_at for s in (bob, *alice[1:])] == [None] * 4
        assert "listen.evicted" in gw.stderr()
    finally:
        for s in (bob, *alice):
            s.close()


@pytest.mark.parametrize("kind", ["get", "listen"])
def test_a_stream_closes_when_the_jwt_it_was_opened_with_expires(tmp_path: Path, kind: str) -> None:
    """A session's GET stream, and a 2026-07-28 listen stream (which stayed open past its token's expiry)."""
    key = rsa_pair("ends-1")
    jwks = JwksServer(keys=[key.jwk]).start()
    port = free_port()
    issuer = "https://idp.test"
    gw = GatewayProcess({"upstreams": {"basic": stdio_upstream()},
                         "auth": {"jwt": {"issuer": issuer, "jwks_url": jwks.url, "algorithms": ["RS256"],
                                          "leeway": "100ms"},
                                  "resource": f"http://127.0.0.1:{port}/mcp"}}, tmp_path, port=port).start()
    try:
        now = int(time.time())
        token = jwt.encode({"iss": issuer, "aud": gw.url, "sub": "carol", "iat": now, "exp": now + 3},
                           key.private, algorithm="RS256", headers={"kid": key.kid})
        session_id = ""
        if kind == "get":
            client = RpcClient(gw.url, bearer(token))
            client.initialize()
            session_id = client.session_id or ""
        stream = Stream(gw.url, session_id, bearer(token), listen=kind == "listen")
        try:
            assert stream.wait_end(8), "the stream outlived its token"
            assert stream.ended_at is not None and time.time() >= now + 3 - 0.5
        finally:
            stream.close()
    finally:
        gw.stop()
        jwks.stop()


# -- what a credential opened ends when the credential stops authenticating (server/standing.py) ---------------

MODERN = "2026-07-28"


class ListenStream:
    """A 2026-07-28 ``subscriptions/listen`` stream read on a thread: the methods that arrived, and its end."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.methods: list[str] = []
        self.ended_at: float | None = None
        self._opened = threading.Event()
        self._client = httpx.Client(timeout=httpx.Timeout(60.0, read=90.0))
        self._body = {"jsonrpc": "2.0", "id": 41, "method": "subscriptions/listen", "params": {
            "notifications": {"toolsListChanged": True},
            "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                      "io.modelcontextprotocol/clientCapabilities": {}}}}
        self._headers = {**headers, "Accept": "application/json, text/event-stream",
                         "Content-Type": "application/json",
                         **request_headers("subscriptions/listen", self._body["params"], MODERN)}
        self._thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self._thread.start()
        assert self._opened.wait(10), "the listen stream did not open"
        assert self.methods[:1] == ["notifications/subscriptions/acknowledged"]

    def _read(self, url: str) -> None:
        try:
            with self._client.stream("POST", url, content=json.dumps(self._body), headers=self._headers) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        self.methods.append(json.loads(line[5:])["method"])
                        self._opened.set()
        except httpx.HTTPError:
            pass
        finally:
            self.ended_at = time.monotonic()
            self._opened.set()

    def wait_end(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return self.ended_at is not None

    def close(self) -> None:
        self._client.close()


def modern_call(url: str, token: str, name: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 42, "method": "tools/call", "params": {
        "name": name, "arguments": {}, "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                                                 "io.modelcontextprotocol/clientCapabilities": {}}}}
    return httpx.post(url, content=json.dumps(body), timeout=30, headers={
        **bearer(token), "Accept": "application/json, text/event-stream", "Content-Type": "application/json",
        **request_headers("tools/call", body["params"], MODERN)})


@pytest.fixture
def idp(tmp_path: Path) -> Iterator[tuple[GatewayProcess, JwksServer, list[Any]]]:
    """A gateway trusting a JWKS of two keys; sessions idle out after 4 s, so a GET stream ticks every 2 s."""
    keys = [rsa_pair("standing-1"), rsa_pair("standing-2")]
    jwks = JwksServer(keys=[k.jwk for k in keys]).start()
    port = free_port()
    gw = GatewayProcess({"upstreams": {"basic": stdio_upstream()},
                         "sessions": {"idle_timeout": "4s"},
                         "auth": {"jwt": {"issuer": "https://idp.test", "jwks_url": jwks.url, "algorithms": ["RS256"],
                                          "leeway": "100ms", "jwks_cache_ttl": "1s"},
                                  "resource": f"http://127.0.0.1:{port}/mcp"}}, tmp_path, port=port).start()
    yield gw, jwks, keys
    gw.stop()
    jwks.stop()


def token_for(gw: GatewayProcess, key: Any, sub: str, lifetime: int) -> str:
    now = int(time.time())
    return jwt.encode({"iss": "https://idp.test", "aud": gw.url, "sub": sub, "iat": now, "exp": now + lifetime},
                      key.private, algorithm="RS256", headers={"kid": key.kid})


def test_a_listen_stream_hears_nothing_once_the_jwt_it_was_opened_with_expires(
        idp: tuple[GatewayProcess, JwksServer, list[Any]]) -> None:
    gw, _, keys = idp
    short, other = token_for(gw, keys[0], "carol", 3), token_for(gw, keys[0], "dave", 600)
    stream = ListenStream(gw.url, bearer(short))
    try:
        assert stream.wait_end(8), "the listen stream outlived its token"
        # An expiry is the token's ordinary end, not a revocation: nothing is audited as a failure.
        assert gw.records("auth.failure") == []
        assert modern_call(gw.url, short, "basic__echo").status_code == 401
        # A list change after the expiry (by someone else) reaches no stream of carol's.
        assert modern_call(gw.url, other, "basic__grow").status_code == 200
        assert stream.methods == ["notifications/subscriptions/acknowledged"]
    finally:
        stream.close()


def test_streams_end_when_the_key_that_signed_their_jwt_leaves_the_jwks(
        idp: tuple[GatewayProcess, JwksServer, list[Any]]) -> None:
    """The IdP withdraws a signing key (a compromised key): tokens it signed stop authenticating once the JWKS
    cache refreshes (at most every 30 s), and so must every stream and session they opened, long before ``exp``."""
    gw, jwks, keys = idp
    withdrawn, kept = token_for(gw, keys[0], "carol", 600), token_for(gw, keys[1], "carol", 600)
    client = RpcClient(gw.url, bearer(withdrawn))
    client.initialize()
    get_stream = Stream(gw.url, client.session_id or "", bearer(withdrawn))
    listen = ListenStream(gw.url, bearer(withdrawn))
    try:
        jwks.keys = [keys[1].jwk]
        deadline = time.monotonic() + 50
        while get_stream.ended_at is None and time.monotonic() < deadline:
            # Carol's client goes on with a token signed by the key that stays, keeping the session in use; its
            # GET stream still holds the withdrawn one.
            assert client.post({"jsonrpc": "2.0", "id": 8, "method": "ping"}, bearer(kept)).status_code == 200
            time.sleep(1)
        assert get_stream.ended_at is not None, "the GET stream outlived the withdrawal of its token's signing key"
        assert listen.wait_end(50), "the listen stream outlived the withdrawal of its token's signing key"
        assert modern_call(gw.url, withdrawn, "basic__echo").status_code == 401
        # The session the withdrawn credential held a stream of ended with it, on every replica.
        assert client.post({"jsonrpc": "2.0", "id": 9, "method": "ping"}, bearer(kept)).status_code == 404
        ends = gw.wait_records("session.end", 1)
        assert [(r["session"], r["reason"], r["principal"]["id"]) for r in ends] == \
            [(client.session_id, "revoked", "carol")]
        # Each revocation is audited as the failed authentication it is, once per stream, naming whose it was.
        failures = [r for r in gw.wait_records("auth.failure", 3) if r["principal"] is not None]
        assert sorted((r["era"], r["session"], r["principal"]["id"]) for r in failures) == \
            [("legacy", client.session_id, "carol"), ("modern", None, "carol")]
        assert modern_call(gw.url, kept, "basic__grow").status_code == 200
        assert listen.methods == ["notifications/subscriptions/acknowledged"]
    finally:
        get_stream.close()
        listen.close()
        client.close()
