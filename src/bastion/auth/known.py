"""The principal as the gateway would authenticate it, from the configured sources, for every tool that evaluates
policy for a named principal without a credential: the console's catalogue ("as seen by") and explain form, and
``bastion policy explain --config``. One resolution for all of them, so none can evaluate a principal other than
the one the gateway builds (an API key's entry carries attributes that ``claims:`` rules match on; a principal
rebuilt from an id and groups alone has none, and is allowed what the gateway denies).

Sources, in the order they are asked:

- no ``auth``: every caller is the anonymous principal, whatever was entered;
- an API key entry with that id (``auth.api_keys`` / ``api_keys_file``): its groups and attributes, exactly as the
  key table builds them; entered groups or claims do not change it (the gateway takes them from the entry);
- a JWT subject (``auth.jwt`` configured): not known in advance, so built from the entered claims as a verified
  token's claims are (groups from ``jwt.groups_claim``, plus any entered groups; attributes: every claim but the
  registered ones);
- otherwise no credential the gateway accepts names it: evaluated as entered, and said so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from bastion.auth.config import ApiKeyEntry, AuthConfig, JwtConfig
from bastion.auth.credentials import CredentialRejected
from bastion.auth.jwt import claim_attributes, claim_groups
from bastion.principal import Principal

Source = Literal["api_key", "jwt", "anonymous", "entered"]


@dataclass(frozen=True, slots=True)
class ResolvedPrincipal:
    principal: Principal
    source: Source
    # One line for people: where the principal's groups and attributes come from.
    detail: str
    # Inputs that did not apply to this source (``groups``, ``claims``), so a page or the CLI can say so.
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PrincipalDirectory:
    """Who the auth config can authenticate: the API key principals (one per id, never a hash) and whether JWT
    subjects are accepted."""

    api_keys: tuple[Principal, ...] = ()
    jwt: JwtConfig | None = None
    auth_enabled: bool = False

    @classmethod
    def from_auth(cls, auth: AuthConfig | None) -> PrincipalDirectory:
        if auth is None or auth.mode == "none":
            return cls()
        return cls(api_keys=_key_principals(auth.api_keys), jwt=auth.jwt, auth_enabled=True)

    def with_keys(self, entries: Iterable[ApiKeyEntry]) -> PrincipalDirectory:
        """The same directory over another key table (the one a reload of the key file put in force)."""
        return replace(self, api_keys=_key_principals(entries))

    @property
    def known(self) -> tuple[Principal, ...]:
        """The principals known in advance: each API key's, or the anonymous principal without ``auth``."""
        return self.api_keys if self.auth_enabled else (Principal.anonymous(),)

    def find(self, principal_id: str) -> Principal | None:
        return next((p for p in self.known if p.id == principal_id), None)

    def resolve(self, principal_id: str, *, groups: Iterable[str] = (),
                claims: Mapping[str, Any] | None = None) -> ResolvedPrincipal:
        """The principal ``principal_id`` is to the gateway. Raises ``ValueError`` for claims a token could not
        carry (a malformed groups claim: the gateway would refuse that token)."""
        entered_groups = frozenset(g for g in groups if g)
        claims = dict(claims or {})
        if not self.auth_enabled:
            ignored = _ignored(entered_groups, claims, frozenset(), {})
            if principal_id not in ("", "anonymous"):
                ignored = ("principal id", *ignored)
            return ResolvedPrincipal(Principal.anonymous(), "anonymous",
                                     "no auth is configured: every caller is the anonymous principal", ignored)
        key = next((p for p in self.api_keys if p.id == principal_id), None)
        if key is not None:
            return ResolvedPrincipal(
                key, "api_key", f"API key entry {key.id!r} (auth): its groups and attributes",
                _ignored(entered_groups, claims, key.groups, key.attributes))
        if self.jwt is not None:
            try:
                token_groups = claim_groups(claims, self.jwt)
            except CredentialRejected as exc:
                raise ValueError(exc.reason) from None
            principal = Principal(id=principal_id, groups=entered_groups | token_groups,
                                  attributes=claim_attributes(claims), auth_method="jwt")
            return ResolvedPrincipal(
                principal, "jwt", f"a JWT subject: no API key has this id; groups from the claims' "
                                  f"{self.jwt.groups_claim!r} and as entered, attributes from the claims entered")
        principal = Principal(id=principal_id, groups=entered_groups, attributes=claim_attributes(claims),
                              auth_method="api_key")
        return ResolvedPrincipal(principal, "entered", "no API key has this id and no JWT is configured: the gateway "
                                                       "authenticates no such principal; evaluated as entered")


def _key_principals(entries: Iterable[ApiKeyEntry]) -> tuple[Principal, ...]:
    # One entry per id (the auth config refuses duplicates; kept defensive, the first listed wins).
    first = {k.id: k for k in reversed(tuple(entries))}
    return tuple(Principal(id=k.id, groups=k.groups, attributes=k.attributes, auth_method="api_key")
                 for _, k in sorted(first.items()))


def _ignored(groups: frozenset[str], claims: Mapping[str, Any], actual_groups: frozenset[str],
             actual_attributes: Mapping[str, Any]) -> tuple[str, ...]:
    out = []
    if groups and groups != actual_groups:
        out.append("groups")
    if claims and claims != dict(actual_attributes):
        out.append("claims")
    return tuple(out)


def known_principals(auth: AuthConfig | None) -> tuple[Principal, ...]:
    """Who the auth config names, as the policy sees them: each API key's id, groups and attributes. The key
    hashes stay behind, so no page can show one. JWT subjects are not known in advance; without ``auth`` every
    caller is the anonymous principal."""
    return PrincipalDirectory.from_auth(auth).known
