"""JWT verification against a real JWKS endpoint on loopback, with keys made for the run."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from structlog.testing import capture_logs

from bastion.auth import AuthConfig, AuthUnavailable, build_authenticator
from bastion.auth.config import JwtConfig
from bastion.auth.credentials import CredentialRejected
from bastion.auth.jwks import JwksCache
from bastion.auth.jwt import JwtVerifier
from bastion.errors import AuthenticationError
from tests.support.jwks import JwksServer, KeyPair

ISSUER = "https://idp.example"
RESOURCE = "https://bastion.example/mcp"


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {"iss": ISSUER, "aud": RESOURCE, "sub": "alice", "iat": now, "nbf": now,
                            "exp": now + 600, "groups": ["eng", "ops"], "email": "alice@example.com"}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def sign(key: KeyPair, alg: str = "RS256", kid: str | None = "default", **overrides: Any) -> str:
    headers = {"kid": key.kid if kid == "default" else kid} if kid is not None else {}
    return jwt.encode(claims(**overrides), key.private, algorithm=alg, headers=headers)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(header: dict[str, Any], payload: dict[str, Any], sign_with: bytes | None) -> str:
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}"
    sig = b"" if sign_with is None else hmac.new(sign_with, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(sig)}"


def jwt_config(server: JwksServer, **overrides: Any) -> JwtConfig:
    cfg: dict[str, Any] = {"issuer": ISSUER, "jwks_url": server.url, "algorithms": ["RS256", "ES256"]}
    cfg.update(overrides)
    auth = AuthConfig.from_mapping({"jwt": cfg, "resource": RESOURCE}, listen_host="0.0.0.0")
    assert auth.jwt is not None
    return auth.jwt


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def verifier(jwks_server: JwksServer, http: httpx.AsyncClient, clock: ManualClock) -> JwtVerifier:
    cfg = jwt_config(jwks_server)
    return JwtVerifier(cfg, JwksCache(cfg.jwks_url, http, ttl_s=cfg.jwks_cache_ttl_s, clock=clock))


async def test_valid_rsa_token(verifier: JwtVerifier, rsa_key: KeyPair) -> None:
    principal = await verifier.verify(sign(rsa_key))
    assert principal.id == "alice"
    assert principal.groups == {"eng", "ops"}
    assert principal.auth_method == "jwt"
    assert dict(principal.attributes) == {"groups": ["eng", "ops"], "email": "alice@example.com"}


async def test_valid_ec_token(verifier: JwtVerifier, ec_key: KeyPair) -> None:
    principal = await verifier.verify(sign(ec_key, alg="ES256", groups="a b  c"))
    assert principal.groups == {"a", "b", "c"}


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"iss": "https://evil.example"}, "InvalidIssuerError"),
    ({"aud": "https://other.example/mcp"}, "InvalidAudienceError"),
    ({"aud": None}, "MissingRequiredClaimError"),
    ({"exp": int(time.time()) - 3600}, "ExpiredSignatureError"),
    ({"exp": None}, "MissingRequiredClaimError"),
    ({"nbf": int(time.time()) + 3600}, "ImmatureSignatureError"),
    ({"iat": int(time.time()) + 3600}, "ImmatureSignatureError"),
    ({"sub": None}, "'sub' is missing"),
    ({"groups": {"eng": True}}, "'groups' is neither"),
])
async def test_invalid_claims(verifier: JwtVerifier, rsa_key: KeyPair, overrides: dict[str, Any],
                              reason: str) -> None:
    with pytest.raises(CredentialRejected, match=reason):
        await verifier.verify(sign(rsa_key, **overrides))


async def test_leeway_accepts_slightly_expired(verifier: JwtVerifier, rsa_key: KeyPair) -> None:
    assert (await verifier.verify(sign(rsa_key, exp=int(time.time()) - 5))).id == "alice"


async def test_alg_none_is_rejected_without_fetching(verifier: JwtVerifier, jwks_server: JwksServer) -> None:
    token = forge({"alg": "none", "typ": "JWT"}, claims(), None)
    with pytest.raises(CredentialRejected, match="alg 'none' is not in the allowed list"):
        await verifier.verify(token)
    assert jwks_server.hits == 0


async def test_hs256_signed_with_the_public_key_is_rejected(verifier: JwtVerifier, rsa_key: KeyPair,
                                                            jwks_server: JwksServer) -> None:
    pem = rsa_key.public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    token = forge({"alg": "HS256", "typ": "JWT", "kid": rsa_key.kid}, claims(), pem)
    with pytest.raises(CredentialRejected, match="HS256"):
        await verifier.verify(token)
    assert jwks_server.hits == 0


async def test_alg_swapped_to_another_allowed_alg_is_rejected(verifier: JwtVerifier, rsa_key: KeyPair) -> None:
    # A token claiming ES256 but naming the RSA key must not be verified with that key.
    token = sign(rsa_key, alg="RS256")
    _, payload, sig = token.split(".")
    swapped = f"{b64(json.dumps({'alg': 'ES256', 'kid': rsa_key.kid}).encode())}.{payload}.{sig}"
    with pytest.raises(CredentialRejected):
        await verifier.verify(swapped)


async def test_tampered_payload_is_rejected(verifier: JwtVerifier, rsa_key: KeyPair) -> None:
    header, _, sig = sign(rsa_key).split(".")
    payload = b64(json.dumps(claims(sub="root")).encode())
    with pytest.raises(CredentialRejected, match="InvalidSignatureError"):
        await verifier.verify(f"{header}.{payload}.{sig}")


async def test_key_of_another_issuer_is_rejected(verifier: JwtVerifier, rsa_key_2: KeyPair) -> None:
    with pytest.raises(CredentialRejected, match="no signing key"):
        await verifier.verify(sign(rsa_key_2))


async def test_unknown_kid_refreshes_at_most_once_per_interval(
        verifier: JwtVerifier, jwks_server: JwksServer, rsa_key: KeyPair, rsa_key_2: KeyPair,
        clock: ManualClock) -> None:
    await verifier.verify(sign(rsa_key))
    assert jwks_server.hits == 1
    clock.now += 31
    jwks_server.keys = [rsa_key.jwk, rsa_key_2.jwk]  # the IdP rotates in a new key
    assert (await verifier.verify(sign(rsa_key_2))).id == "alice"
    assert jwks_server.hits == 2
    for kid in ("made-up-1", "made-up-2", "made-up-3"):
        with pytest.raises(CredentialRejected):
            await verifier.verify(sign(rsa_key_2, kid=kid))
    assert jwks_server.hits == 2  # a flood of unknown kids costs the IdP nothing within the interval
    clock.now += 31
    with pytest.raises(CredentialRejected):
        await verifier.verify(sign(rsa_key_2, kid="made-up-4"))
    assert jwks_server.hits == 3


async def test_cache_ttl_refetches(verifier: JwtVerifier, jwks_server: JwksServer, rsa_key: KeyPair,
                                   clock: ManualClock) -> None:
    await verifier.verify(sign(rsa_key))
    clock.now += 299
    await verifier.verify(sign(rsa_key))
    assert jwks_server.hits == 1
    clock.now += 2
    await verifier.verify(sign(rsa_key))
    assert jwks_server.hits == 2


async def test_jwks_down_keeps_cached_keys(verifier: JwtVerifier, jwks_server: JwksServer, rsa_key: KeyPair,
                                           clock: ManualClock) -> None:
    await verifier.verify(sign(rsa_key))
    jwks_server.stop()
    clock.now += 3600
    with capture_logs() as logs:
        assert (await verifier.verify(sign(rsa_key))).id == "alice"
    failed = [e for e in logs if e["event"] == "jwks_fetch_failed"]
    assert len(failed) == 1
    assert failed[0]["keeping_cached"] is True


async def test_jwks_never_reachable_is_503(jwks_server: JwksServer, http: httpx.AsyncClient,
                                           rsa_key: KeyPair) -> None:
    cfg = jwt_config(jwks_server)
    jwks_server.stop()
    verifier = JwtVerifier(cfg, JwksCache(cfg.jwks_url, http, ttl_s=300))
    with pytest.raises(AuthUnavailable) as info:
        await verifier.verify(sign(rsa_key))
    assert info.value.status == 503


async def test_jwks_not_json_or_empty_keeps_nothing(jwks_server: JwksServer, http: httpx.AsyncClient,
                                                    rsa_key: KeyPair) -> None:
    cfg = jwt_config(jwks_server)
    jwks_server.keys = [{"kty": "oct", "k": "c2VjcmV0", "kid": rsa_key.kid}]  # a symmetric key is never used
    verifier = JwtVerifier(cfg, JwksCache(cfg.jwks_url, http, ttl_s=300))
    with pytest.raises(AuthUnavailable):
        await verifier.verify(sign(rsa_key))


async def test_concurrent_cold_start_fetches_once(verifier: JwtVerifier, jwks_server: JwksServer,
                                                  rsa_key: KeyPair) -> None:
    token = sign(rsa_key)
    results = await asyncio.gather(*(verifier.verify(token) for _ in range(20)))
    assert {p.id for p in results} == {"alice"}
    assert jwks_server.hits == 1


async def test_custom_claims(jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: KeyPair) -> None:
    cfg = jwt_config(jwks_server, principal_claim="email", groups_claim="realm_access.roles")
    verifier = JwtVerifier(cfg, JwksCache(cfg.jwks_url, http, ttl_s=300))
    principal = await verifier.verify(sign(rsa_key, realm_access={"roles": ["admin"]}))
    assert principal.id == "alice@example.com"
    assert principal.groups == {"admin"}


async def test_authenticator_end_to_end(jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: KeyPair,
                                        rsa_key_2: KeyPair) -> None:
    from bastion.auth import generate_key

    key, entry = generate_key("ci-bot", ["ci"])
    cfg = AuthConfig.from_mapping({
        "api_keys": [entry.to_mapping()],
        "jwt": {"issuer": ISSUER, "jwks_url": jwks_server.url},
        "resource": RESOURCE, "scopes_supported": ["mcp"],
    }, listen_host="0.0.0.0")
    auth = build_authenticator(cfg, http)
    metadata = 'resource_metadata="https://bastion.example/.well-known/oauth-protected-resource/mcp"'

    assert (await auth.authenticate({"Authorization": f"Bearer {sign(rsa_key)}"})).auth_method == "jwt"
    assert (await auth.authenticate({"Authorization": f"Bearer {key}"})).id == "ci-bot"
    assert jwks_server.hits == 1  # the API key never caused JWKS traffic

    with pytest.raises(AuthenticationError) as missing:
        await auth.authenticate({})
    assert missing.value.headers["WWW-Authenticate"] == f'Bearer realm="bastion", scope="mcp", {metadata}'

    bad_token = sign(rsa_key_2)
    with capture_logs() as logs, pytest.raises(AuthenticationError) as invalid:
        await auth.authenticate({"Authorization": f"Bearer {bad_token}"})
    err = invalid.value
    assert err.headers["WWW-Authenticate"] == f'Bearer realm="bastion", error="invalid_token", scope="mcp", {metadata}'
    assert err.message == "Invalid credentials"
    assert err.log_detail is not None
    assert "no signing key" in err.log_detail
    assert bad_token not in err.log_detail
    assert all(bad_token not in repr(event) for event in logs)

    with pytest.raises(AuthenticationError, match="Invalid credentials"):
        await auth.authenticate({"X-API-Key": sign(rsa_key)})  # X-API-Key carries keys only, never JWTs


async def test_a_token_whose_subject_is_an_api_keys_id_is_refused(jwks_server: JwksServer, http: httpx.AsyncClient,
                                                                 rsa_key: KeyPair) -> None:
    """A principal is known by its id alone (policy ``ids:``, a session bound to its principal, rate-limit
    buckets): a valid token whose subject is ``ci-bot`` would have been the API key ``ci-bot`` in all of them."""
    from bastion.auth import generate_key

    key, entry = generate_key("ci-bot", ["ci"])
    cfg = AuthConfig.from_mapping({"api_keys": [entry.to_mapping()],
                                   "jwt": {"issuer": ISSUER, "jwks_url": jwks_server.url},
                                   "resource": RESOURCE}, listen_host="0.0.0.0")
    auth = build_authenticator(cfg, http)
    with capture_logs(), pytest.raises(AuthenticationError) as refused:
        await auth.authenticate({"Authorization": f"Bearer {sign(rsa_key, sub='ci-bot')}"})
    assert refused.value.log_detail is not None and "API key's id" in refused.value.log_detail
    # The key itself, and a token of another subject, are unaffected.
    assert (await auth.authenticate({"Authorization": f"Bearer {key}"})).auth_method == "api_key"
    assert (await auth.authenticate({"Authorization": f"Bearer {sign(rsa_key, sub='alice')}"})).id == "alice"
