"""The legacy ``initialize`` handshake, as pure data: what bastion offers and what it accepts back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.errors import UpstreamUnavailable
from bastion.upstream.base import UpstreamInfo

__all__ = ["LEGACY_VERSIONS", "PROTOCOL_VERSION", "initialize_params", "parse_initialize_result"]

PROTOCOL_VERSION = "2025-11-25"
# Every handshake-era revision: the server may answer with an older one and we speak it.
LEGACY_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})

# Only what the core relays to clients: advertising a capability bastion cannot honour would break the upstream.
_CLIENT_CAPABILITIES: Mapping[str, Any] = {"sampling": {}, "elicitation": {}, "roots": {"listChanged": True}}


def initialize_params(client_version: str) -> dict[str, Any]:
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": dict(_CLIENT_CAPABILITIES),
        "clientInfo": {"name": "bastion", "version": client_version},
    }


def parse_initialize_result(upstream: str, result: Mapping[str, Any]) -> UpstreamInfo:
    version = result.get("protocolVersion")
    if version not in LEGACY_VERSIONS:
        raise UpstreamUnavailable(upstream, log_detail=f"upstream answered initialize with version {version!r}")
    capabilities = result.get("capabilities")
    server_info = result.get("serverInfo")
    instructions = result.get("instructions")
    return UpstreamInfo(
        era="legacy",
        protocol_version=str(version),
        capabilities=capabilities if isinstance(capabilities, Mapping) else {},
        server_info=server_info if isinstance(server_info, Mapping) else {},
        instructions=instructions if isinstance(instructions, str) else None,
    )
