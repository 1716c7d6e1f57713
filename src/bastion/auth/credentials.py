"""Reading credentials out of request headers, building the 401 challenge, and stripping credentials before
anything is forwarded. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from starlette.datastructures import Headers

from bastion.errors import AuthenticationError, BastionError, HttpError

REALM = "bastion"

# Headers that carry the *client's* credentials to bastion. They are consumed here and must never be sent on to
# an upstream: bastion authenticates to upstreams with its own, separately configured credentials (MCP forbids
# token passthrough; a forwarded key would also let any upstream impersonate the caller elsewhere).
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "cookie", "proxy-authorization"})
# The headers a credential is read from. Each must reach bastion at most once: with two copies, which one is the
# caller would depend on which copy a reader takes, and a proxy in front may take the other. The front door
# refuses a second copy before authentication (``server/checks.SINGLETON_HEADERS`` is built from this), and
# ``extract_credential`` refuses one wherever else headers come from (the admin API and console).
CREDENTIAL_SOURCES = ("authorization", "x-api-key")

# Generous for any real JWT, small enough that nobody makes bastion base64-decode megabytes per request.
MAX_CREDENTIAL_LENGTH = 16 * 1024

ChallengeError = Literal["invalid_request", "invalid_token"]


class CredentialRejected(BastionError):
    """Internal: a credential was checked and failed. ``reason`` is for the log; the client sees a generic 401."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AuthUnavailable(HttpError):
    """The token cannot be checked right now (no signing keys were ever fetched). 503, not 401: the client's
    credentials may be fine, and a 401 would send it into a pointless re-authentication loop.
    """

    def __init__(self, *, log_detail: str | None = None) -> None:
        super().__init__(503, "Authentication temporarily unavailable", headers={"Retry-After": "30"},
                         log_detail=log_detail)


@dataclass(frozen=True, slots=True)
class Credential:
    """A presented credential. ``source`` says which header it came from; ``value`` is secret: never log it."""

    source: Literal["bearer", "x-api-key"]
    value: str

    def __repr__(self) -> str:
        return f"Credential(source={self.source!r}, value=<redacted>)"

    def looks_like_jwt(self) -> bool:
        """Compact JWS shape: three non-empty base64url segments. Cheap, so API keys never hit the JWKS."""
        parts = self.value.split(".")
        return len(parts) == 3 and all(parts)


@dataclass(frozen=True, slots=True)
class Challenge:
    """What goes into ``WWW-Authenticate``: fixed per deployment except for the error code."""

    resource_metadata: str | None = None
    scope: tuple[str, ...] = ()

    def header(self, error: ChallengeError | None = None) -> str:
        params = [f'realm="{REALM}"']
        if error is not None:
            params.append(f'error="{error}"')
        if self.scope:
            params.append(f'scope="{" ".join(self.scope)}"')
        if self.resource_metadata is not None:
            params.append(f'resource_metadata="{self.resource_metadata}"')
        return "Bearer " + ", ".join(params)

    def missing(self) -> AuthenticationError:
        # RFC 6750 §3.1: no error code when the request carried no credentials at all.
        return AuthenticationError("Authentication required", challenge=self.header(),
                                   log_detail="no credentials presented")

    def malformed(self, reason: str) -> AuthenticationError:
        return AuthenticationError("Invalid credentials", challenge=self.header("invalid_request"),
                                   log_detail=reason)

    def invalid(self, reason: str) -> AuthenticationError:
        return AuthenticationError("Invalid credentials", challenge=self.header("invalid_token"),
                                   log_detail=reason)


def extract_credential(headers: Mapping[str, str], challenge: Challenge) -> Credential | None:
    """The one credential in ``Authorization: Bearer`` or ``X-API-Key``; ``None`` when there is none.

    Raises a 401 for a malformed header or when both are present (RFC 6750 §2: one method per request; accepting
    either would make the principal depend on which header a proxy kept).
    """
    bearer = _get(headers, "authorization")
    api_key = _get(headers, "x-api-key")
    for name, value in (("authorization", bearer), ("x-api-key", api_key)):
        if value is not None and isinstance(headers, Headers) and len(headers.getlist(name)) > 1:
            raise challenge.malformed(f"{name} presented more than once")
    if bearer is not None and api_key is not None:
        raise challenge.malformed("both Authorization and X-API-Key presented")
    if bearer is not None:
        scheme, _, token = bearer.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise challenge.malformed(f"unsupported Authorization scheme {scheme[:20]!r}")
        return _credential("bearer", token.strip(), challenge)
    if api_key is not None:
        return _credential("x-api-key", api_key.strip(), challenge)
    return None


def strip_credentials(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """A copy of ``headers`` without any of ``CREDENTIAL_HEADERS`` (case-insensitive)."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {name: value for name, value in items if name.lower() not in CREDENTIAL_HEADERS}


def _credential(source: Literal["bearer", "x-api-key"], value: str, challenge: Challenge) -> Credential:
    if not value:
        raise challenge.malformed(f"empty {source} credential")
    if len(value) > MAX_CREDENTIAL_LENGTH:
        raise challenge.malformed(f"{source} credential of {len(value)} characters")
    return Credential(source, value)


def _get(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None or isinstance(headers, Headers):
        # Starlette's Headers, and the front door's FrontHeaders built on them, are already case-insensitive: a
        # miss is a miss, and scanning them again (each decoded anew) cost more than the rest of authentication.
        return value
    # Plain dicts (the console, tests) are not.
    for key, val in headers.items():
        if key.lower() == name:
            return val
    return None
