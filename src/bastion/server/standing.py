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

What the authenticator consults may also change while a stream waits: a reload of the API key file swaps the key
table. Such a change is counted (``AuthChanges``), and every stream waiting for its next message is woken to check
at once (``Standing.recheck``), not at its next tick: a key removed from the file ends the streams it opened as
promptly as it refuses the next request. The count a stream was authenticated under is taken when its request is
(``AUTH_EPOCH`` in the request's scope), so a change landing between the request's authentication and the stream's
first wait is not missed either.

A revocation is audited here, for every kind of stream, as the failed authentication it is (``auth.failure``,
with the reason class the authenticator gave); an expiry is not (it is the ordinary end of a token's life, and
the client goes on with a fresh one). An authenticator that cannot check right now (``AuthUnavailable``: no
signing keys could ever be fetched) keeps the stream, as an unreachable session store does: an IdP outage must
not log everyone out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request

from bastion.auth.credentials import AuthUnavailable
from bastion.call import Era
from bastion.errors import AuditUnavailable, AuthenticationError
from bastion.principal import Principal

__all__ = ["AUTH_EPOCH", "AuthChanges", "OnRevoked", "Reauthenticate", "Standing", "StandingOf", "Verdict",
           "standing_of"]

# The request scope's key for ``AuthChanges.number`` as the request was authenticated.
AUTH_EPOCH = "bastion.auth_epoch"

# The authenticator itself (no audit record, no log per check): request headers -> principal, or it raises.
Reauthenticate = Callable[[Mapping[str, str]], Awaitable[Principal]]
EndReason = Literal["credential_expired", "revoked"]
# Audits a revocation (``auth.failure``): the stream's standing, and the authenticator's reason.
OnRevoked = Callable[["Standing", str | None], Awaitable[None]]
# (the principal a request authenticated, the request, its era, its session) -> how a stream it opens re-checks
# them.
StandingOf = Callable[[Principal, Request, Era, str | None], "Standing"]


class AuthChanges:
    """Counts the changes to what the authenticator consults (a key table swapped in by a reload); each wakes
    every stream waiting in ``after``. Lives in one event loop: ``advance`` from it, ``after`` in it."""

    __slots__ = ("_changed", "number")

    def __init__(self) -> None:
        self.number = 0
        # Made by the first waiter, set and dropped by the next change: no waiter, no event.
        self._changed: asyncio.Event | None = None

    def advance(self) -> None:
        self.number += 1
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def after(self, number: int) -> None:
        """Return once a change after ``number`` was made (at once if one already was)."""
        while self.number == number:
            changed = self._changed
            if changed is None:
                changed = self._changed = asyncio.Event()
            await changed.wait()


@dataclass(frozen=True, slots=True)
class Verdict:
    """``ended`` is ``None`` while the credential authenticates ``principal``; otherwise why it ended (and the
    authenticator's operator-facing ``detail``)."""

    principal: Principal
    ended: EndReason | None = None
    detail: str | None = None


class Standing:
    """How one long-lived request was authenticated, asked again on demand."""

    __slots__ = ("_changes", "_checked", "_clock", "_on_revoked", "_reauthenticate", "era", "headers", "principal",
                 "remote_addr", "session")

    def __init__(self, principal: Principal, headers: Mapping[str, str], reauthenticate: Reauthenticate | None,
                 *, remote_addr: str | None = None, era: Era = "legacy", session: str | None = None,
                 on_revoked: OnRevoked | None = None, clock: Callable[[], float] = time.time,
                 changes: AuthChanges | None = None, checked: int | None = None) -> None:
        self.principal = principal
        self.headers = headers
        self.remote_addr = remote_addr
        self.era: Era = era
        self.session = session
        self._reauthenticate = reauthenticate
        self._on_revoked = on_revoked
        self._clock = clock
        self._changes = changes
        # The change count the credential was last checked under: from the request's authentication when known.
        self._checked = checked if checked is not None else changes.number if changes is not None else 0

    @property
    def recheck(self) -> Callable[[], Awaitable[None]] | None:
        """What returns once the credential is due a check before its tick (the authenticator's sources changed
        since it was last checked); None when nothing can change them."""
        return None if self._changes is None or self._reauthenticate is None else self._changed

    async def _changed(self) -> None:
        assert self._changes is not None
        await self._changes.after(self._checked)

    def seconds_left(self) -> float | None:
        """Until the credential's own expiry, if it has one: the stream re-checks then, not a tick later."""
        expires = self.principal.expires_at
        return None if expires is None else expires - self._clock()

    async def check(self) -> Verdict:
        if self._reauthenticate is None:
            return self._expiry_only()
        if self._changes is not None:
            # Taken before the authenticator reads its sources: a change made while it runs is checked again.
            self._checked = self._changes.number
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


def standing_of(reauthenticate: Reauthenticate | None, on_revoked: OnRevoked | None = None,
                changes: AuthChanges | None = None) -> StandingOf:
    """The factory the front door hands to what opens streams. Without ``reauthenticate`` (an endpoint built
    without an authenticator, in tests) only a credential's own expiry ends a stream. ``changes``: counted changes
    of what the authenticator consults, which wake every stream to check at once."""
    def make(principal: Principal, request: Request, era: Era, session: str | None) -> Standing:
        checked = request.scope.get(AUTH_EPOCH)
        return Standing(principal, request.headers, reauthenticate,
                        remote_addr=request.client.host if request.client else None, era=era, session=session,
                        on_revoked=on_revoked, changes=changes, checked=checked if isinstance(checked, int) else None)
    return make
