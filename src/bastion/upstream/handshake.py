"""The legacy ``initialize`` handshake, as pure data: what bastion offers and what it accepts back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from bastion.errors import UpstreamUnavailable
from bastion.protocol.messages import InitializeResult
from bastion.protocol.versions import HANDSHAKE_VERSIONS, LATEST_HANDSHAKE
from bastion.upstream.base import UpstreamInfo

__all__ = ["HANDSHAKE_VERSIONS", "PROTOCOL_VERSION", "initialize_params", "parse_initialize_result"]

# bastion asks for the latest handshake-era revision; the server may answer with any older one (HANDSHAKE_VERSIONS),
# and bastion speaks it.
PROTOCOL_VERSION = LATEST_HANDSHAKE

# Only what the core relays to clients: advertising a capability bastion cannot honour would break the upstream.
_CLIENT_CAPABILITIES: Mapping[str, Any] = {"sampling": {}, "elicitation": {}, "roots": {"listChanged": True}}


def initialize_params(client_version: str) -> dict[str, Any]:
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": dict(_CLIENT_CAPABILITIES),
        "clientInfo": {"name": "bastion", "version": client_version},
    }


def parse_initialize_result(upstream: str, answer: Mapping[str, Any]) -> UpstreamInfo:
    result = cast(InitializeResult, answer)
    version = result.get("protocolVersion")
    if version not in HANDSHAKE_VERSIONS:
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
