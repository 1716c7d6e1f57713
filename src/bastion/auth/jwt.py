"""Bearer JWT verification: signature against the issuer's JWKS, then ``iss``, ``aud``, ``exp``, ``nbf``, ``iat``.

The token itself is never logged or kept; only the claims that become the principal survive verification.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jwt as pyjwt
from jwt.exceptions import PyJWTError

from bastion.auth.config import JwtConfig
from bastion.auth.credentials import CredentialRejected
from bastion.auth.jwks import JwksCache
from bastion.principal import Principal

# RFC 7519 §4.1: these describe the token, not the caller, so they are not principal attributes.
REGISTERED_CLAIMS = frozenset({"iss", "sub", "aud", "exp", "nbf", "iat", "jti"})


class JwtVerifier:
    def __init__(self, cfg: JwtConfig, keys: JwksCache) -> None:
        self._cfg = cfg
        self._keys = keys

    async def verify(self, token: str) -> Principal:
        """The principal a valid token names. Raises ``CredentialRejected`` (or ``AuthUnavailable``)."""
        try:
            header = pyjwt.get_unverified_header(token)
        except PyJWTError as exc:
            raise CredentialRejected(f"malformed JWT: {exc}") from None
        alg = header.get("alg")
        # Checked before any key lookup, so tokens with a forbidden alg never cause a JWKS fetch.
        if not isinstance(alg, str) or alg not in self._cfg.algorithms:
            raise CredentialRejected(f"JWT alg {str(alg)[:20]!r} is not in the allowed list")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise CredentialRejected("JWT kid is not a string")
        key = await self._keys.key_for(kid, alg)
        try:
            claims = pyjwt.decode(
                token, key=key, algorithms=list(self._cfg.algorithms), audience=list(self._cfg.audience),
                issuer=self._cfg.issuer, leeway=self._cfg.leeway_s,
                options={"require": ["exp", "iss", "aud"], "verify_signature": True, "verify_exp": True,
                         "verify_nbf": True, "verify_iat": True, "verify_aud": True, "verify_iss": True},
            )
        except PyJWTError as exc:
            raise CredentialRejected(f"JWT rejected ({type(exc).__name__}): {exc}") from None
        return principal_from_claims(claims, self._cfg)


def principal_from_claims(claims: Mapping[str, Any], cfg: JwtConfig) -> Principal:
    """Pure mapping of verified claims to a principal."""
    principal_id = _claim(claims, cfg.principal_claim)
    if not isinstance(principal_id, str) or not principal_id:
        raise CredentialRejected(f"JWT claim {cfg.principal_claim!r} is missing or not a string")
    exp = claims.get("exp")
    expires_at = float(exp) + cfg.leeway_s if isinstance(exp, int | float) and not isinstance(exp, bool) else None
    return Principal(id=principal_id, groups=claim_groups(claims, cfg), attributes=claim_attributes(claims),
                     auth_method="jwt", expires_at=expires_at)


def claim_groups(claims: Mapping[str, Any], cfg: JwtConfig) -> frozenset[str]:
    """The groups a token's claims give (``jwt.groups_claim``: a list of strings, or one space-separated string)."""
    raw_groups = _claim(claims, cfg.groups_claim)
    if raw_groups is None:
        return frozenset()
    if isinstance(raw_groups, str):
        return frozenset(raw_groups.split())
    if isinstance(raw_groups, list) and all(isinstance(g, str) for g in raw_groups):
        return frozenset(raw_groups)
    # Fail loudly rather than quietly dropping groups: a wrong claim shape is an IdP config error.
    raise CredentialRejected(f"JWT claim {cfg.groups_claim!r} is neither a list of strings nor a string")


def claim_attributes(claims: Mapping[str, Any]) -> Mapping[str, Any]:
    """The principal's attributes: every claim but those describing the token itself."""
    return MappingProxyType({k: v for k, v in claims.items() if k not in REGISTERED_CLAIMS})


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    """A claim by name; a dotted name (``realm_access.roles``) walks nested objects when no literal claim has it."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value
