"""Protocol revisions, by era. The session-based revisions are listed oldest first, as they were published."""

from __future__ import annotations

__all__ = [
    "BATCH_VERSION",
    "HANDSHAKE_VERSIONS",
    "LATEST_HANDSHAKE",
    "MODERN_VERSION",
    "MODERN_VERSIONS",
    "SUPPORTED_VERSIONS",
]

# The handshake era: a session opened by ``initialize``, whose answer settles the version.
HANDSHAKE_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
# What bastion offers a client that asks for a version it does not speak, and what it asks upstreams for.
LATEST_HANDSHAKE = HANDSHAKE_VERSIONS[-1]
# The only revision with JSON-RPC batches (added in 2025-03-26, removed in 2025-06-18).
BATCH_VERSION = "2025-03-26"

# The stateless era: no handshake, every request names its version in ``_meta``.
MODERN_VERSION = "2026-07-28"
MODERN_VERSIONS: tuple[str, ...] = (MODERN_VERSION,)

# Every version bastion serves, newest first: ``server/discover`` and the -32022 error list them in this order.
SUPPORTED_VERSIONS: tuple[str, ...] = (*MODERN_VERSIONS, *reversed(HANDSHAKE_VERSIONS))
