"""HTTP-level checks that run before bastion reads a body: Origin, Host, Accept. Pure functions over headers."""

from __future__ import annotations

from urllib.parse import urlsplit

from bastion.errors import HttpError
from bastion.settings import ListenConfig, is_loopback_host


def _hostname(value: str) -> str:
    # "[::1]:8080" -> "::1", "localhost:8080" -> "localhost"
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def check_origin(origin: str | None, listen: ListenConfig) -> None:
    """Browsers send ``Origin``; a page on a foreign site must not drive a gateway reachable from the browser.

    Absent ``Origin`` (non-browser clients) is fine. A present one must be configured, or be a loopback origin
    while bastion itself listens on loopback.
    """
    if origin is None:
        return
    if origin in listen.allowed_origins or "*" in listen.allowed_origins:
        return
    parts = urlsplit(origin)
    if listen.is_loopback and parts.scheme in ("http", "https") and parts.hostname and \
            is_loopback_host(parts.hostname):
        return
    raise HttpError(403, "Forbidden: Origin not allowed", log_detail=f"origin={origin[:200]}")


def check_host(host: str | None, listen: ListenConfig) -> None:
    """DNS rebinding: a loopback listener answers only to loopback names (plus configured ones)."""
    if not listen.is_loopback:
        return
    if host is None:
        raise HttpError(400, "Bad Request: missing Host header")
    name = _hostname(host)
    if is_loopback_host(name) or host in listen.allowed_hosts or name in listen.allowed_hosts:
        return
    raise HttpError(421, "Misdirected Request: Host not allowed", log_detail=f"host={host[:200]}")


def accepts(accept: str | None) -> tuple[bool, bool]:
    """(json ok, sse ok). A missing or wildcard Accept accepts both."""
    if not accept:
        return True, True
    value = accept.lower()
    wildcard = "*/*" in value
    return ("application/json" in value or "application/*" in value or wildcard,
            "text/event-stream" in value or "text/*" in value or wildcard)
