"""JWT bearer tokens through the running gateway, and rate limits held exactly by two replicas sharing Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.jwks import JwksServer, KeyPair, rsa_pair
from tests.support.net import free_port
from tests.support.redis_server import RedisServer
from tests.support.rpc import RpcClient

ISSUER = "https://idp.test"


@pytest.fixture(scope="module")
def signing_key() -> KeyPair:
    return rsa_pair("e2e-1")


@pytest.fixture(scope="module")
def jwt_gateway(tmp_path_factory: pytest.TempPathFactory, signing_key: KeyPair) -> Iterator[GatewayProcess]:
    jwks = JwksServer(keys=[signing_key.jwk]).start()
    workdir: Path = tmp_path_factory.mktemp("jwt")
    (workdir / "policies").mkdir()
    (workdir / "policies" / "p.yaml").write_text(
        "version: 1\nrules:\n  - id: eng\n    effect: allow\n    principals: {groups: [eng]}\n"
        "    tools: [basic__echo]\n")
    port = free_port()
    gw = GatewayProcess({"upstreams": {"basic": stdio_upstream()}, "policies": str(workdir / "policies"),
                         "auth": {"jwt": {"issuer": ISSUER, "jwks_url": jwks.url, "algorithms": ["RS256"]},
                                  "resource": f"http://127.0.0.1:{port}/mcp"}}, workdir, port=port).start()
    yield gw
    gw.stop()
    jwks.stop()


def token(key: KeyPair, audience: str, **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": audience, "sub": "carol", "iat": now, "exp": now + 300, "groups": ["eng"], **claims}
    return jwt.encode(body, key.private, algorithm="RS256", headers={"kid": key.kid})


def test_a_valid_token_authenticates_and_its_groups_drive_the_policy(jwt_gateway: GatewayProcess,
                                                                     signing_key: KeyPair) -> None:
    client = RpcClient(jwt_gateway.url, {"Authorization": f"Bearer {token(signing_key, jwt_gateway.url)}"})
    client.initialize()
    assert client.tool_names() == ["basic__echo"]
    assert client.call("basic__echo", {"message": "jwt"})["result"]["content"][0]["text"] == "jwt"


@pytest.mark.parametrize("claims", [{"aud": "https://someone-else/mcp"}, {"iss": "https://evil.test"},
                                    {"exp": 1_000_000}])
def test_tokens_for_another_audience_issuer_or_time_are_refused(jwt_gateway: GatewayProcess,
                                                                signing_key: KeyPair, claims: dict[str, Any]) -> None:
    bad = token(signing_key, jwt_gateway.url, **claims)
    r = RpcClient(jwt_gateway.url, {"Authorization": f"Bearer {bad}"}).post(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}}})
    assert r.status_code == 401
    challenge = r.headers["www-authenticate"]
    assert 'error="invalid_token"' in challenge
    assert "resource_metadata=" in challenge


def test_protected_resource_metadata_is_published(jwt_gateway: GatewayProcess) -> None:
    doc = httpx.get(jwt_gateway.base + "/.well-known/oauth-protected-resource/mcp", timeout=10).json()
    assert doc["resource"] == jwt_gateway.url
    assert doc["authorization_servers"] == [ISSUER]


@pytest.fixture(scope="module")
def limited_pair(tmp_path_factory: pytest.TempPathFactory,
                 redis_server: RedisServer) -> Iterator[list[GatewayProcess]]:
    workdir: Path = tmp_path_factory.mktemp("limited")
    config = {"auth": "none", "redis": {"url": redis_server.url.replace("/0", "/4")},
              "upstreams": {"basic": stdio_upstream()},
              # This test is about exact counting across replicas; a generous Redis bound keeps a CPU-starved
              # test machine from turning a slow round trip into a "limiter unavailable" refusal.
              "rate_limits": {"key_prefix": f"bastion:rl:e2e{time.time_ns()}", "timeout": "3s",
                              "defaults": [{"name": "per-caller", "rate": "10/hour", "burst": 10, "per": "principal"}]}}
    gws = [GatewayProcess(config, workdir).start(), GatewayProcess(config, workdir).start()]
    yield gws
    for gw in gws:
        gw.stop()


def test_two_replicas_sharing_redis_allow_exactly_the_limit(limited_pair: list[GatewayProcess]) -> None:
    clients = []
    for gw in limited_pair:
        c = RpcClient(gw.url)
        c.initialize()
        clients.append(c)

    def call(i: int) -> dict[str, Any]:
        c = RpcClient(limited_pair[i % 2].url, first_id=100 + i)  # concurrent in one session: ids apart
        c.session_id = clients[i % 2].session_id
        try:
            return c.call("basic__echo", {"message": str(i)})
        finally:
            c.close()

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(call, range(30)))
    ok = [a for a in answers if "result" in a]
    limited = [a["error"] for a in answers if "error" in a]
    assert len(ok) == 10
    assert len(limited) == 20
    assert {e["code"] for e in limited} == {-31001}
    assert all(e["data"]["limit"] == "per-caller" and e["data"]["retryAfter"] > 0 for e in limited)
