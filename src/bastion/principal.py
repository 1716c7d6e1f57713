"""Who is calling. Produced by authentication, consumed by policy, limits and audit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

AuthMethod = Literal["none", "api_key", "jwt"]


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller.

    ``id`` is stable (API key id, or the JWT ``sub``); ``groups`` drive most policy rules; ``attributes`` are the
    key entry's attributes or the token's claims (never the token itself).
    """

    id: str
    groups: frozenset[str] = frozenset()
    attributes: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    auth_method: AuthMethod = "none"
    # When the credential expires (epoch seconds; a JWT's ``exp`` plus the allowed leeway), if it does: what
    # outlives one request (a GET stream) ends then. Not part of who the caller is (equality, hashing).
    expires_at: float | None = field(default=None, compare=False)

    @classmethod
    def anonymous(cls) -> Principal:
        return cls(id="anonymous", auth_method="none")
