"""Authentication: who is calling. Runs on every HTTP request, before anything else looks at the body.

The core calls ``build_authenticator(cfg, http, key_ring(cfg))`` once at startup and
``await authenticator.authenticate(headers)`` per request; the key file's watcher (``auth.keyfile``) swaps the table
in the ring while the gateway runs. Failures are ``AuthenticationError`` (401, with a ``WWW-Authenticate`` challenge) or
``AuthUnavailable`` (503); both are ``HttpError`` and carry the reason in ``log_detail`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import httpx

from bastion.auth.apikeys import ApiKeyTable, KeyRing, generate_key, hash_key
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
    "KeyRing",
    "build_authenticator",
    "generate_key",
    "hash_key",
    "is_loopback_host",
    "key_ring",
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

    def __init__(self, *, keys: KeyRing | None, jwt: JwtVerifier | None, challenge: Challenge) -> None:
        # The ring, not a table: the key file's reloads swap the table in it, and each request reads the one in
        # force (``KeyRing``).
        self._keys = keys
        self._jwt = jwt
        self._challenge = challenge

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        credential = extract_credential(headers, self._challenge)
        if credential is None:
            raise self._challenge.missing()
        try:
            return await self._check(credential)
        except CredentialRejected as exc:
            raise self._challenge.invalid(f"{credential.source}: {exc.reason}") from None

    async def _check(self, credential: Credential) -> Principal:
        table = self._keys.table if self._keys is not None else None
        if table is not None:
            principal = table.principal(credential.value)
            if principal is not None:
                return principal
        if self._jwt is not None and credential.source == "bearer" and credential.looks_like_jwt():
            principal = await self._jwt.verify(credential.value)
            # A principal is known by its id alone (policy ``ids:``, sessions bound to their principal, rate-limit
            # buckets, flow contexts, approvals), so one id must stand for one caller. A token whose subject is an
            # API key's id would be that key's principal: refused, whoever signed it. Asked of the table in force
            # now (after the verification's awaits): a key added by a reload claims its id from then on.
            table = self._keys.table if self._keys is not None else None
            if table is not None and principal.id in table.ids:
                raise CredentialRejected(f"JWT principal {principal.id[:64]!r} is an API key's id: one id, one "
                                         "caller")
            return principal
        if self._keys is None:
            raise CredentialRejected("API keys are not enabled and the credential is not a bearer JWT")
        raise CredentialRejected("unknown API key")


def key_ring(cfg: AuthConfig) -> KeyRing | None:
    """The key table ``cfg`` starts with, in its ring; None when API keys are not enabled (no ``api_keys`` and no
    ``api_keys_file``). With a key file the ring exists even while the file holds no entry: a reload may add some."""
    if cfg.mode == "none" or not (cfg.api_keys or cfg.api_keys_file is not None):
        return None
    return KeyRing(ApiKeyTable(cfg.api_keys), inline=cfg.inline_api_keys)


def build_authenticator(cfg: AuthConfig, http: httpx.AsyncClient, keys: KeyRing | None = None) -> Authenticator:
    """The authenticator for ``cfg``. ``http`` fetches the JWKS; the caller owns (and closes) it. ``keys``: the
    ring whose table the key file's reloads swap (``key_ring(cfg)`` when not given)."""
    if cfg.mode == "none":
        return AnonymousAuthenticator()
    challenge = Challenge(resource_metadata=metadata_url(cfg),
                          scope=cfg.scopes_supported if cfg.jwt is not None else ())
    if keys is None:
        keys = key_ring(cfg)
    verifier = None
    if cfg.jwt is not None:
        jwks = JwksCache(cfg.jwt.jwks_url, http, ttl_s=cfg.jwt.jwks_cache_ttl_s)
        verifier = JwtVerifier(cfg.jwt, jwks)
    return CredentialAuthenticator(keys=keys, jwt=verifier, challenge=challenge)
