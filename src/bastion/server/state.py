"""The ``requestState`` bastion hands to modern clients in multi round-trip requests. Pure, no I/O.

When an upstream answers ``input_required``, the client fulfils the input requests and retries with the state it
was given. Everything a client echoes is attacker-controlled, so bastion never hands out the upstream's state
bare: it wraps it in a token that names the upstream and the request it belongs to, binds it to the principal and
an expiry, and signs it (HMAC-SHA256). A retry whose token was altered, has expired, was issued to another
principal, or is replayed against another tool, prompt, resource or set of arguments is refused before anything
reaches an upstream. The token is signed, not encrypted: the upstream's own state was visible to the client
anyway; the principal appears only as a keyed hash.

Replicas must share the key (``sessions.state_key`` / ``BASTION_STATE_KEY``): a token minted on one replica is
verified on whichever replica the retry lands. Without a configured key each process draws a random one, and
retries that land on another replica (or after a restart) are refused as invalid.

Single use is not enforced here: an upstream that needs it must enforce it on its own state, which it alone
understands; within the expiry a client may replay a retry exactly as it may replay any request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from bastion.errors import InvalidParams
from bastion.outcome import Outcome
from bastion.settings import StateConfig

__all__ = ["ROUND_FIELDS", "InvalidRequestState", "RoundTrip", "StateConfig", "StateSealer", "request_digest"]

FORMAT_TAG = "bastion.rs1."
# Fields of a retried request that change between rounds; everything else must be the original request. They are
# also the fields bastion rebuilds for the upstream rather than copies (its envelope and the per-round fields).
ROUND_FIELDS = frozenset({"_meta", "inputResponses", "requestState"})


class InvalidRequestState(InvalidParams):
    """A retry's ``requestState`` cannot be honoured. The message says which check failed, never the secret.
    A call refused for it is recorded as denied (docs/audit.md), not as an internal error."""

    outcome: ClassVar[Outcome | None] = "denied"

    def __init__(self, reason: str) -> None:
        super().__init__(f"Invalid requestState: {reason}; start the request again without it",
                         http_status=400, log_detail=reason)


@dataclass(frozen=True, slots=True)
class RoundTrip:
    """What a verified token says: which upstream asked, and the upstream's own state to hand back to it."""

    upstream: str
    upstream_state: str | None
    # bastion's own approval round (see bastion.approvals.guard): "ask:<rule>" when this state carried the
    # approval question, "ok:<rule>" once the user approved and the upstream asked for more.
    approval: str | None = None


def request_digest(method: str, target: str, params: Mapping[str, Any]) -> str:
    """A digest of the original request: method, public name or URI, and every field but the per-round ones."""
    stable = {k: v for k, v in params.items() if k not in ROUND_FIELDS}
    blob = orjson.dumps([method, target, stable], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:32]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class StateSealer:
    def __init__(self, config: StateConfig) -> None:
        self._key = config.key or secrets.token_bytes(32)
        self.ttl_s = config.ttl_s
        self.shared = config.key is not None

    def _principal(self, principal_id: str) -> str:
        # Keyed, so the token does not reveal the principal id and cannot be matched across deployments.
        return hmac.new(self._key, b"principal\x00" + principal_id.encode("utf-8"), hashlib.sha256).hexdigest()[:32]

    def _sign(self, body: bytes) -> bytes:
        return hmac.new(self._key, b"request-state\x00" + body, hashlib.sha256).digest()

    def seal(self, *, principal_id: str, digest: str, upstream: str, upstream_state: str | None,
             now: float, approval: str | None = None) -> str:
        claims: dict[str, Any] = {"p": self._principal(principal_id), "d": digest, "u": upstream,
                                  "s": upstream_state, "x": int(now + self.ttl_s)}
        if approval is not None:
            claims["a"] = approval
        body = orjson.dumps(claims)
        return FORMAT_TAG + _b64(body) + "." + _b64(self._sign(body))

    def open(self, token: Any, *, principal_id: str, digest: str, now: float) -> RoundTrip:
        """Verify a token against the retry it arrived with. Raises ``InvalidRequestState``."""
        if not isinstance(token, str) or not token.startswith(FORMAT_TAG) or token.count(".") != 3:
            raise InvalidRequestState("not a requestState this gateway issued")
        body_text, _, mac_text = token[len(FORMAT_TAG):].partition(".")
        try:
            body, mac = _unb64(body_text), _unb64(mac_text)
        except (binascii.Error, ValueError):
            raise InvalidRequestState("not a requestState this gateway issued") from None
        if not hmac.compare_digest(mac, self._sign(body)):
            raise InvalidRequestState("signature check failed (altered, or issued by another deployment)")
        try:
            claims = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise InvalidRequestState("malformed") from None
        if not isinstance(claims, dict) or not isinstance(claims.get("x"), int) or \
                not isinstance(claims.get("u"), str) or not isinstance(claims.get("s"), str | None):
            raise InvalidRequestState("malformed")
        if now >= claims["x"]:
            raise InvalidRequestState("expired")
        if not hmac.compare_digest(str(claims.get("p")), self._principal(principal_id)):
            raise InvalidRequestState("issued to another principal")
        if claims.get("d") != digest:
            raise InvalidRequestState("issued for a different request")
        approval = claims.get("a")
        return RoundTrip(upstream=claims["u"], upstream_state=claims["s"],
                         approval=approval if isinstance(approval, str) else None)
