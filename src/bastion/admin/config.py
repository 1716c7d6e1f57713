"""The ``admin:`` section: the console's own listener and who may use it.

Absent (or ``admin: null``) means no console: nothing listens. ``host`` defaults to loopback; a non-loopback host
needs gateway authentication (``auth``) configured, since without it the console could not tell admins apart.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bastion.errors import ConfigError

_DEFAULT_HOST = "127.0.0.1"
_DEFAULT_PORT = 9190
_DEFAULT_SESSION_TTL_S = 3600.0
_DEFAULT_LIVE_BUFFER = 1000
_DEFAULT_GROUPS = ("admin",)
_KEYS = {"enabled", "host", "port", "allowed_hosts", "groups", "principals", "session_ttl_s", "secret", "live_buffer"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class AdminConfig:
    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 9190
    # Extra Host values a loopback console answers to (DNS-rebinding protection, as ``listen.allowed_hosts``).
    allowed_hosts: tuple[str, ...] = ()
    # Who is an admin: a principal in one of these groups (API key groups, or the JWT group claim), or one of these
    # ids. The anonymous principal never is.
    groups: tuple[str, ...] = ("admin",)
    principals: tuple[str, ...] = ()
    session_ttl_s: float = 3600.0
    # Signs the session cookie. Unset: a random key per process (sessions end with a restart, which is fine for a
    # console on one replica); set it to keep sessions across restarts.
    secret: str | None = None
    # Audit records kept for the live table (the newest win).
    live_buffer: int = 1000

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @classmethod
    def from_mapping(cls, data: Any, where: str) -> AdminConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a mapping")
        unknown = set(data) - _KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key(s): {', '.join(sorted(map(str, unknown)))}")
        host = data.get("host", _DEFAULT_HOST)
        port = data.get("port", _DEFAULT_PORT)
        if not isinstance(host, str) or not host:
            raise ConfigError(f"{where}.host: expected a host name or address")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ConfigError(f"{where}.port: expected a port number (0 picks a free one)")
        ttl = data.get("session_ttl_s", _DEFAULT_SESSION_TTL_S)
        if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl <= 0:
            raise ConfigError(f"{where}.session_ttl_s: expected a positive number of seconds")
        buffer = data.get("live_buffer", _DEFAULT_LIVE_BUFFER)
        if not isinstance(buffer, int) or isinstance(buffer, bool) or not 1 <= buffer <= 100_000:
            raise ConfigError(f"{where}.live_buffer: expected an integer between 1 and 100000")
        secret = data.get("secret")
        if secret is not None and (not isinstance(secret, str) or len(secret) < 32):
            raise ConfigError(f"{where}.secret: expected a string of at least 32 characters")
        enabled = data.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{where}.enabled: expected true or false")
        return cls(enabled=enabled, host=host, port=port,
                   allowed_hosts=_strings(data, "allowed_hosts", where, ()),
                   groups=_strings(data, "groups", where, _DEFAULT_GROUPS),
                   principals=_strings(data, "principals", where, ()), session_ttl_s=float(ttl), secret=secret,
                   live_buffer=buffer)

    def check_auth(self, auth_enabled: bool) -> None:
        """Without gateway authentication every caller is anonymous: only a loopback console is allowed."""
        if self.enabled and not auth_enabled and not self.loopback:
            raise ConfigError(f"admin.host: {self.host!r} is not loopback, and without 'auth' the console cannot "
                              "authenticate admins; configure auth (API keys or JWT) or listen on 127.0.0.1")


def _strings(data: Mapping[str, Any], key: str, where: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}.{key}: expected a list of names")
    return tuple(value)
