"""The issuer's signing keys (JWKS), fetched over HTTP and cached.

Refresh rules, and why:
- the set is refetched once it is older than ``ttl_s`` (key rotation is picked up without a restart);
- a token whose ``kid`` is unknown triggers a refetch (the IdP may have just rotated), but fetch attempts are
  spaced at least ``min_refresh_interval_s`` apart, so a flood of tokens with made-up ``kid`` values costs the
  IdP one request per interval, not one per token;
- a failed fetch keeps the last good keys: an IdP blip must not log everyone out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import orjson
import structlog
from jwt import PyJWK
from jwt.exceptions import PyJWTError

from bastion.auth.credentials import AuthUnavailable, CredentialRejected

log = structlog.get_logger("bastion.auth.jwks")

MAX_JWKS_BYTES = 1024 * 1024

Jwk = Mapping[str, Any]


class JwksFetchError(Exception):
    """Internal to this module: one fetch attempt failed. Never leaves it."""


def parse_jwks(doc: object) -> tuple[Jwk, ...]:
    """The signature keys of a JWKS document. Symmetric (``oct``) keys and keys marked for encryption are
    dropped: a public key set has no business holding either.
    """
    if not isinstance(doc, Mapping) or not isinstance(doc.get("keys"), list):
        raise JwksFetchError("document has no 'keys' list")
    keys: list[Jwk] = []
    for jwk in doc["keys"]:
        if not isinstance(jwk, Mapping) or not isinstance(jwk.get("kty"), str) or jwk["kty"] == "oct":
            continue
        if jwk.get("use", "sig") != "sig":
            continue
        keys.append(jwk)
    if not keys:
        raise JwksFetchError("document holds no usable signature keys")
    return tuple(keys)


def select_key(keys: Sequence[Jwk], kid: str | None, alg: str) -> Jwk | None:
    """The key a token names. A token without ``kid`` is accepted only when the set holds exactly one key."""
    candidates = [k for k in keys if k.get("alg") in (None, alg)]
    if kid is None:
        return candidates[0] if len(keys) == 1 and candidates else None
    return next((k for k in candidates if k.get("kid") == kid), None)


class JwksCache:
    def __init__(self, url: str, http: httpx.AsyncClient, *, ttl_s: float, min_refresh_interval_s: float = 30.0,
                 timeout_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._url = url
        self._http = http
        self._ttl_s = ttl_s
        self._min_interval_s = min_refresh_interval_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._keys: tuple[Jwk, ...] | None = None
        self._fetched_at = 0.0
        self._last_attempt: float | None = None
        self._prepared: dict[tuple[str | None, str], PyJWK] = {}

    async def key_for(self, kid: str | None, alg: str) -> PyJWK:
        """The verification key for a token's ``kid`` and ``alg``.

        Raises ``CredentialRejected`` when no such key exists, ``AuthUnavailable`` when no keys were ever fetched.
        """
        if self._keys is None or self._clock() - self._fetched_at >= self._ttl_s:
            await self._refresh("expired" if self._keys is not None else "initial")
        jwk = select_key(self._keys or (), kid, alg)
        if jwk is None and self._keys is not None:
            await self._refresh("unknown_kid")
            jwk = select_key(self._keys or (), kid, alg)
        if self._keys is None:
            raise AuthUnavailable(log_detail=f"no signing keys could be fetched from {self._url}")
        if jwk is None:
            raise CredentialRejected(f"no signing key for kid={kid!r} alg={alg}")
        return self._prepare(jwk, kid, alg)

    def _prepare(self, jwk: Jwk, kid: str | None, alg: str) -> PyJWK:
        cached = self._prepared.get((kid, alg))
        if cached is not None:
            return cached
        try:
            # Binding the algorithm to the key here is what makes a PS256 key unusable for an RS256 token, or an
            # RSA key for HS256: PyJWT refuses a token whose alg differs from the key's.
            key = PyJWK(dict(jwk), algorithm=alg)
        except PyJWTError as exc:
            raise CredentialRejected(f"key kid={kid!r} does not fit alg={alg}: {exc}") from None
        self._prepared[(kid, alg)] = key
        return key

    async def _refresh(self, reason: str) -> None:
        async with self._lock:
            now = self._clock()
            if self._last_attempt is not None and now - self._last_attempt < self._min_interval_s:
                return
            self._last_attempt = now
            try:
                keys = await self._fetch()
            except JwksFetchError as exc:
                log.warning("jwks_fetch_failed", url=self._url, reason=reason, error=str(exc),
                            keeping_cached=self._keys is not None)
                return
            self._keys = keys
            self._fetched_at = now
            self._prepared = {}
            log.info("jwks_fetched", url=self._url, reason=reason, keys=len(keys))

    async def _fetch(self) -> tuple[Jwk, ...]:
        try:
            async with self._http.stream("GET", self._url, headers={"Accept": "application/json"},
                                         timeout=self._timeout_s, follow_redirects=False) as response:
                if response.status_code != 200:
                    raise JwksFetchError(f"HTTP {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body.extend(chunk)
                    if len(body) > MAX_JWKS_BYTES:
                        raise JwksFetchError(f"document larger than {MAX_JWKS_BYTES} bytes")
        except httpx.HTTPError as exc:
            raise JwksFetchError(f"{type(exc).__name__}: {exc}") from None
        try:
            doc = orjson.loads(bytes(body))
        except orjson.JSONDecodeError:
            raise JwksFetchError("document is not JSON") from None
        return parse_jwks(doc)
