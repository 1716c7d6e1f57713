"""Signed session cookies and CSRF tokens: pure functions of a key, a clock and the request's values.

A session cookie is ``base64url(json payload) "." base64url(HMAC-SHA256(key, payload))``. The payload names the
admin (id, groups, how authenticated), when it expires, the session's own random id (what a logout revokes, see
``revocation.py``: a signature alone cannot be taken back) and the session's CSRF token (synchronizer token: every
state-changing form carries it and it must equal the session's; a cross-site page can neither read the cookie nor
the token). Before login there is no session, so the login form uses a signed double-submit token instead: a
random value in its own HttpOnly cookie, and the same value signed into the form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from bastion.principal import AuthMethod

COOKIE = "bastion_admin"
LOGIN_COOKIE = "bastion_admin_login"


@dataclass(frozen=True, slots=True)
class AdminSession:
    admin: str
    groups: tuple[str, ...]
    auth_method: AuthMethod
    expires: float
    csrf: str
    # Random per login: the handle a logout revokes (``Revocations``); never shown, never the CSRF token.
    sid: str
    # For a login with an API key: which key (``Signer.bind`` of its hash). The session lasts only while that very
    # key is in the key table in force: a key revoked (removed, or replaced under the same id) ends it.
    key: str | None = None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def sign(self, payload: bytes) -> str:
        return _b64(payload) + "." + _b64(hmac.new(self._key, payload, hashlib.sha256).digest())

    def unsign(self, token: str) -> bytes | None:
        body, sep, mac = token.partition(".")
        if not sep:
            return None
        try:
            payload, given = _unb64(body), _unb64(mac)
        except (ValueError, TypeError):
            return None
        want = hmac.new(self._key, payload, hashlib.sha256).digest()
        return payload if hmac.compare_digest(want, given) else None

    def issue(self, admin: str, groups: tuple[str, ...], auth_method: AuthMethod, *, now: float,
              ttl_s: float, key: str | None = None) -> tuple[str, AdminSession]:
        session = AdminSession(admin, groups, auth_method, now + ttl_s, secrets.token_urlsafe(32),
                               secrets.token_urlsafe(16), key)
        payload = json.dumps({"a": admin, "g": list(groups), "m": auth_method, "e": session.expires,
                              "c": session.csrf, "s": session.sid, "k": key}, separators=(",", ":")).encode()
        return self.sign(payload), session

    def bind(self, key_hash: str) -> str:
        """What a session names its API key by: keyed by the signing key, so the cookie (readable by whoever holds
        it) carries neither the key nor its hash."""
        return _b64(hmac.new(self._key, b"api-key:" + key_hash.encode(), hashlib.sha256).digest())

    def session(self, cookie: str | None, *, now: float) -> AdminSession | None:
        """The session a cookie carries, or ``None`` when absent, forged, malformed or expired. Whether it was
        revoked (logged out) is not the signature's to say: the console asks ``Revocations`` as well."""
        if not cookie:
            return None
        payload = self.unsign(cookie)
        if payload is None:
            return None
        try:
            data = json.loads(payload)
            key = data.get("k")
            session = AdminSession(str(data["a"]), tuple(str(g) for g in data["g"]), data["m"], float(data["e"]),
                                   str(data["c"]), str(data["s"]), key if isinstance(key, str) else None)
        except (ValueError, KeyError, TypeError):
            return None
        return session if session.expires > now else None

    def login_token(self) -> tuple[str, str]:
        """(cookie value, form value) for the login form's double-submit check."""
        nonce = secrets.token_urlsafe(32)
        return nonce, self.sign(b"login:" + nonce.encode())

    def login_ok(self, cookie: str | None, form: str | None) -> bool:
        if not cookie or not form:
            return False
        payload = self.unsign(form)
        return payload is not None and hmac.compare_digest(payload, b"login:" + cookie.encode())


def csrf_ok(session: AdminSession, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(session.csrf.encode(), presented.encode())
