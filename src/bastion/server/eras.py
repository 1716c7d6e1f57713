"""Results shaped for the era of the client that asked, whatever the era of the upstream that answered. Pure.

A 2026-07-28 upstream's results carry fields a handshake-era client has never heard of (``resultType``, caching
hints, the server's identity in ``_meta``); a handshake-era upstream's results lack what a modern client requires
(``resultType``). Caching hints bastion sets itself, for the aggregated view (``Dispatcher``), never the
upstream's: only bastion knows whether what it serves is filtered per caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.protocol.meta import SERVER_INFO_KEY, SUBSCRIPTION_ID_KEY
from bastion.protocol.methods import INPUT_CAPABILITY

__all__ = ["MODERN_ONLY_FIELDS", "for_handshake_era", "for_modern", "is_input_required", "undeclared_inputs"]

MODERN_ONLY_FIELDS = ("resultType", "ttlMs", "cacheScope")
# Stamped by modern servers; meaningless (or misleading) to a handshake-era client.
MODERN_ONLY_META = (SERVER_INFO_KEY, SUBSCRIPTION_ID_KEY)


def is_input_required(result: Mapping[str, Any]) -> bool:
    return result.get("resultType") == "input_required"


def for_handshake_era(result: dict[str, Any]) -> dict[str, Any]:
    """Drop the modern-only fields; an empty ``_meta`` left behind goes too. A result with neither (nearly every
    tool result) is returned as it is: nothing downstream changes it, it is only encoded."""
    if "_meta" not in result and not any(k in result for k in MODERN_ONLY_FIELDS):
        return result
    out = {k: v for k, v in result.items() if k not in MODERN_ONLY_FIELDS}
    meta = out.get("_meta")
    if isinstance(meta, Mapping):
        rest = {k: v for k, v in meta.items() if k not in MODERN_ONLY_META}
        if rest:
            out["_meta"] = rest
        else:
            del out["_meta"]
    return out


def for_modern(result: dict[str, Any], server_info: Mapping[str, Any]) -> dict[str, Any]:
    """``resultType`` (``complete`` when an upstream of the handshake era sent none) and bastion's identity: the
    client talks to bastion, not to whichever upstream answered."""
    out = dict(result)
    out.setdefault("resultType", "complete")
    meta = out.get("_meta")
    out["_meta"] = {**(meta if isinstance(meta, Mapping) else {}), SERVER_INFO_KEY: dict(server_info)}
    return out


def undeclared_inputs(input_requests: Any, capabilities: Mapping[str, Any]) -> list[str]:
    """Keys of input requests the client cannot answer (unknown kind, or a capability it did not declare)."""
    if not isinstance(input_requests, Mapping):
        return []
    bad = []
    for key, request in input_requests.items():
        method = request.get("method") if isinstance(request, Mapping) else None
        capability = INPUT_CAPABILITY.get(method) if isinstance(method, str) else None
        if capability is None or capability not in capabilities:
            bad.append(str(key))
    return sorted(bad)
