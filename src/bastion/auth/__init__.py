"""Authentication: who is calling. Runs on every HTTP request, before anything else looks at the body.

The core calls ``build_authenticator(cfg, http)`` once at startup and ``await authenticator.authenticate(headers)``
per request. Failures are ``AuthenticationError`` (401, with a ``WWW-Authenticate`` challenge) or
``AuthUnavailable`` (503); both are ``HttpError`` and carry the reason in ``log_detail`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import httpx

from bastion.auth.apikeys import ApiKeyTable, generate_key, hash_key
from bastion.auth.config import ApiKeyEntry, AuthConfig, JwtConfig, is_loopback_host
from bastion.auth.credentials import (
    CREDENTIAL_HEADERS,
    AuthUnavailable,
    Challenge,
    Credential,
    CredentialRejected,
    extract_credential,
    strip_credentials,
)
from bastion.auth.jwks import JwksCache
from bastion.auth.jwt import JwtVerifier
from bastion.auth.metadata import metadata_paths, metadata_url, protected_resource_metadata
from bastion.principal import Principal

__all__ = [
    "CREDENTIAL_HEADERS",
    "AnonymousAuthenticator",
    "ApiKeyEntry",
    "AuthConfig",
    "AuthUnavailable",
    "Authenticator",
    "CredentialAuthenticator",
    "JwtConfig",
    "build_authenticator",
    "generate_key",
    "hash_key",
    "is_loopback_host",
    "metadata_paths",
    "metadata_url",
    "protected_resource_metadata",
    "strip_credentials",
]


class Authenticator(Protocol):
    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The caller's principal; raises ``AuthenticationError`` (401) or ``AuthUnavailable`` (503)."""
        ...


class AnonymousAuthenticator:
    """``auth: none``: everyone is the anonymous principal, whatever headers they send (one immutable instance,
    not one per request)."""

    def __init__(self) -> None:
        self._anonymous = Principal.anonymous()

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        return self._anonymous


class CredentialAuthenticator:
    """API keys and/or JWTs. The key table is consulted first (one hash, no I/O); only a bearer token shaped
    like a JWT goes on to JWT verification, so API keys never cause JWKS traffic.
    """

    def __init__(self, *, keys: ApiKeyTable | None, jwt: JwtVerifier | None, challenge: Challenge) -> None:
        self._keys = keys
        self._jwt = jwt
        self._challenge = challenge
        # A principal is known by its id alone (policy ``ids:``, sessions bound to their principal, rate-limit
        # buckets, flow contexts, approvals), so one id must stand for one caller. A token whose subject is an API
        # key's id would be that key's principal: refused, whoever signed it.
        self._key_ids = keys.ids if keys is not None else frozenset()

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        credential = extract_credential(headers, self._challenge)
        if credential is None:
            raise self._challenge.missing()
        try:
            return await self._check(credential)
        except CredentialRejected as exc:
            raise self._challenge.invalid(f"{credential.source}: {exc.reason}") from None

    async def _check(self, credential: Credential) -> Principal:
        if self._keys is not None:
            principal = self._keys.principal(credential.value)
            if principal is not None:
                return principal
        if self._jwt is not None and credential.source == "bearer" and credential.looks_like_jwt():
            principal = await self._jwt.verify(credential.value)
            if principal.id in self._key_ids:
                raise CredentialRejected(f"JWT principal {principal.id[:64]!r} is an API key's id: one id, one "
                                         "caller")
            return principal
        if self._keys is None:
            raise CredentialRejected("API keys are not enabled and the credential is not a bearer JWT")
        raise CredentialRejected("unknown API key")


def build_authenticator(cfg: AuthConfig, http: httpx.AsyncClient) -> Authenticator:
    """The authenticator for ``cfg``. ``http`` fetches the JWKS; the caller owns (and closes) it."""
    if cfg.mode == "none":
        return AnonymousAuthenticator()
    challenge = Challenge(resource_metadata=metadata_url(cfg),
                          scope=cfg.scopes_supported if cfg.jwt is not None else ())
    keys = ApiKeyTable(cfg.api_keys) if cfg.api_keys else None
    verifier = None
    if cfg.jwt is not None:
        jwks = JwksCache(cfg.jwt.jwks_url, http, ttl_s=cfg.jwt.jwks_cache_ttl_s)
        verifier = JwtVerifier(cfg.jwt, jwks)
    return CredentialAuthenticator(keys=keys, jwt=verifier, challenge=challenge)
