"""The capabilities a client declares, checked where they enter: ``initialize`` (session-based revisions) and
``_meta.clientCapabilities`` (2026-07-28, on every request).

bastion reads them ("may this client be asked for input?") and forwards the input ones to 2026-07-28 upstreams,
which validate them. Taken unchecked, a client that declared ``{"elicitation": "yes"}`` was treated as able to
answer elicitations, and every later call it made to a 2026-07-28 upstream failed there with that upstream's
-32602. The schema makes every member an object; a value that is not one is refused where it is declared, with
the request's id, so the client learns what is wrong at once rather than from an upstream later.
"""

from __future__ import annotations

from typing import Any

from bastion.errors import INVALID_PARAMS, ProtocolError

__all__ = ["KNOWN_CAPABILITIES", "checked_capabilities"]

# ClientCapabilities members in the revisions bastion serves (schema.ts, 2024-11-05 to 2026-07-28); each is an
# object. Members bastion does not know pass through unread: it never forwards them.
KNOWN_CAPABILITIES = frozenset({"experimental", "roots", "sampling", "elicitation", "tasks", "extensions"})


def checked_capabilities(value: object, where: str, *, http_status: int = 200) -> dict[str, Any]:
    """``value`` as a client's capabilities; raises ``ProtocolError`` (-32602) when it is not an object or a
    member the schema defines is not one. ``where`` names the field in the error."""
    if not isinstance(value, dict):
        raise ProtocolError(INVALID_PARAMS, f"{where} must be an object", http_status=http_status)
    for name in KNOWN_CAPABILITIES.intersection(value):
        if not isinstance(value[name], dict):
            raise ProtocolError(INVALID_PARAMS, f"{where}.{name} must be an object", http_status=http_status)
    return value
