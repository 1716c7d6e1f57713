"""Whether what a credential opened may go on: the credential is authenticated again, as it is now.

A GET stream or a ``subscriptions/listen`` stream is authenticated once, when it opens, and may stay open for
hours. What authenticated it can stop doing so in that time: a JWT expires, the IdP withdraws the key that signed
it from its JWKS (picked up at the cache's next refresh), whatever else the authenticator consults changes. So a
stream does not rely on how it was opened: at each keep-alive tick (and at a JWT's ``exp``) it presents the
request's own credential to the authenticator again, against the authentication config and the signing keys in
force then, the same check a new request gets. The request's headers are held for the stream's life anyway (they
are the ASGI scope's), so nothing is kept that was not already.

``Standing.check`` answers with one of:

- the principal now: the credential still authenticates it (its groups and attributes as they are now, which
  every later delivery is judged with);
- ``credential_expired``: the credential's own expiry passed; the client reconnects with a fresh one;
- ``revoked``: the credential fails for any other reason, or now stands for another principal.

A revocation is audited here, for every kind of stream, as the failed authentication it is (``auth.failure``,
with the reason class the authenticator gave); an expiry is not (it is the ordinary end of a token's life, and
the client goes on with a fresh one). An authenticator that cannot check right now (``AuthUnavailable``: no
signing keys could ever be fetched) keeps the stream, as an unreachable session store does: an IdP outage must
not log everyone out.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from bastion.auth.credentials import AuthUnavailable
from bastion.call import Era
from bastion.errors import AuditUnavailable, AuthenticationError
from bastion.principal import Principal

__all__ = ["OnRevoked", "Reauthenticate", "Standing", "StandingOf", "Verdict", "standing_of"]

# The authenticator itself (no audit record, no log per check): request headers -> principal, or it raises.
Reauthenticate = Callable[[Mapping[str, str]], Awaitable[Principal]]
EndReason = Literal["credential_expired", "revoked"]
# Audits a revocation (``auth.failure``): the stream's standing, and the authenticator's reason.
OnRevoked = Callable[["Standing", str | None], Awaitable[None]]
# (the principal a request authenticated, its headers, the client's address, its era, its session) -> how a
# stream it opens re-checks them.
StandingOf = Callable[[Principal, Mapping[str, str], str | None, Era, str | None], "Standing"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """``ended`` is ``None`` while the credential authenticates ``principal``; otherwise why it ended (and the
    authenticator's operator-facing ``detail``)."""

    principal: Principal
    ended: EndReason | None = None
    detail: str | None = None


class Standing:
    """How one long-lived request was authenticated, asked again on demand."""

    __slots__ = ("_clock", "_on_revoked", "_reauthenticate", "era", "headers", "principal", "remote_addr",
                 "session")

    def __init__(self, principal: Principal, headers: Mapping[str, str], reauthenticate: Reauthenticate | None,
                 *, remote_addr: str | None = None, era: Era = "legacy", session: str | None = None,
                 on_revoked: OnRevoked | None = None, clock: Callable[[], float] = time.time) -> None:
        self.principal = principal
        self.headers = headers
        self.remote_addr = remote_addr
        self.era: Era = era
        self.session = session
        self._reauthenticate = reauthenticate
        self._on_revoked = on_revoked
        self._clock = clock

    def seconds_left(self) -> float | None:
        """Until the credential's own expiry, if it has one: the stream re-checks then, not a tick later."""
        expires = self.principal.expires_at
        return None if expires is None else expires - self._clock()

    async def check(self) -> Verdict:
        if self._reauthenticate is None:
            return self._expiry_only()
        try:
            now = await self._reauthenticate(self.headers)
        except AuthUnavailable:
            return self._expiry_only()
        except AuthenticationError as exc:
            left = self.seconds_left()
            if left is not None and left <= 0:
                return Verdict(self.principal, "credential_expired", exc.log_detail)
            return await self._revoked(exc.log_detail)
        if now.id != self.principal.id:
            return await self._revoked("the credential now authenticates another principal")
        self.principal = now
        # Its own expiry decides even if the authenticator allowed a moment's leeway more: a stream waiting for it
        # must not wake again at once.
        return self._expiry_only()

    async def _revoked(self, detail: str | None) -> Verdict:
        if self._on_revoked is not None:
            # The stream ends all the same; a failing sink reports itself.
            with contextlib.suppress(AuditUnavailable):
                await self._on_revoked(self, detail)
        return Verdict(self.principal, "revoked", detail)

    def _expiry_only(self) -> Verdict:
        left = self.seconds_left()
        if left is not None and left <= 0:
            return Verdict(self.principal, "credential_expired", "the credential expired")
        return Verdict(self.principal)


def standing_of(reauthenticate: Reauthenticate | None, on_revoked: OnRevoked | None = None) -> StandingOf:
    """The factory the front door hands to what opens streams. Without ``reauthenticate`` (an endpoint built
    without an authenticator, in tests) only a credential's own expiry ends a stream."""
    def make(principal: Principal, headers: Mapping[str, str], remote_addr: str | None, era: Era,
             session: str | None) -> Standing:
        return Standing(principal, headers, reauthenticate, remote_addr=remote_addr, era=era, session=session,
                        on_revoked=on_revoked)
    return make
