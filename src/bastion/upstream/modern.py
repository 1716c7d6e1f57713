"""The 2026-07-28 (stateless) revision as pure data: the per-request envelope, ``server/discover``, result types,
and the era verdicts a dual-era client draws from a probe's answer.

No I/O here; the transports call these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

from bastion.errors import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    MISSING_CLIENT_CAPABILITY,
    UNSUPPORTED_PROTOCOL_VERSION,
    UpstreamRpcError,
    UpstreamUnavailable,
)
from bastion.protocol.messages import DiscoverResult
from bastion.protocol.meta import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    SUBSCRIPTION_ID_KEY,
)
from bastion.protocol.versions import MODERN_VERSION
from bastion.upstream.base import UpstreamInfo

__all__ = [
    "CLIENT_CAPABILITIES_KEY",
    "CLIENT_INFO_KEY",
    "MODERN_VERSION",
    "PROTOCOL_VERSION_KEY",
    "SERVER_INFO_KEY",
    "SUBSCRIPTION_ID_KEY",
    "UnknownResultType",
    "Verdict",
    "check_result",
    "discover_verdict",
    "envelope",
    "error_verdict",
    "http_probe_verdict",
    "listen_params",
    "offers_list_changes",
    "parse_discover_result",
]

# The JSON-RPC errors only a 2026-07-28 server sends in answer to a modern request (spec: "Backward compatibility").
_MODERN_ERRORS = frozenset({UNSUPPORTED_PROTOCOL_VERSION, MISSING_CLIENT_CAPABILITY, HEADER_MISMATCH, METHOD_NOT_FOUND})
# resultType values of the core protocol; an extension's own values would need that extension, which we never offer.
_RESULT_TYPES = frozenset({"complete", "input_required"})

Verdict = Literal["modern", "legacy", "unsupported"]


class UnknownResultType(UpstreamRpcError):
    """A modern upstream answered with a ``resultType`` this client does not know; the answer cannot be used."""

    def __init__(self, upstream: str, result_type: Any) -> None:
        super().__init__(INTERNAL_ERROR, f"Upstream '{upstream}' sent a result of an unknown type",
                         data={"upstream": upstream},
                         log_detail=f"resultType {str(result_type)[:64]!r}")


def envelope(params: Mapping[str, Any] | None, client_version: str) -> dict[str, Any]:
    """``params`` with the per-request ``_meta`` fields every modern request carries.

    A caller's ``_meta`` survives (progress tokens, log levels, trace context), except that version and client
    identity are ours. Client capabilities are the caller's only when it passes them explicitly (the core relays
    those to a client); otherwise bastion declares none, so an upstream never asks for input nobody will give.
    """
    body = dict(params) if params is not None else {}
    meta = body.get("_meta")
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    capabilities = meta.get(CLIENT_CAPABILITIES_KEY)
    meta[PROTOCOL_VERSION_KEY] = MODERN_VERSION
    meta[CLIENT_CAPABILITIES_KEY] = dict(capabilities) if isinstance(capabilities, Mapping) else {}
    meta[CLIENT_INFO_KEY] = {"name": "bastion", "version": client_version}
    body["_meta"] = meta
    return body


def offers_list_changes(capabilities: Mapping[str, Any]) -> bool:
    """Whether listening is worth it: the server says some list of it can change."""
    return any(isinstance(c := capabilities.get(kind), Mapping) and c.get("listChanged") is True
               for kind in ("tools", "prompts", "resources"))


def listen_params() -> dict[str, Any]:
    """What bastion subscribes to: the list changes that make it refresh its catalogue."""
    return {"notifications": {"toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True}}


def check_result(upstream: str, result: dict[str, Any]) -> dict[str, Any]:
    """A modern result, unchanged: absent ``resultType`` reads as ``complete``; unknown values are refused.

    ``input_required`` results (multi round-trip requests) go back to the caller as they are: the core bridges
    them, and ``requestState`` must reach the client byte-exact.
    """
    result_type = result.get("resultType", "complete")
    if result_type not in _RESULT_TYPES:
        raise UnknownResultType(upstream, result_type)
    return result


def parse_discover_result(upstream: str, answer: Mapping[str, Any]) -> UpstreamInfo:
    result = cast(DiscoverResult, answer)
    versions = result.get("supportedVersions")
    if not isinstance(versions, list) or MODERN_VERSION not in versions:
        raise UpstreamUnavailable(upstream, log_detail=f"server/discover offers versions {versions!r}")
    capabilities = result.get("capabilities")
    meta = result.get("_meta")
    server_info = meta.get(SERVER_INFO_KEY) if isinstance(meta, Mapping) else None
    instructions = result.get("instructions")
    return UpstreamInfo(
        era="modern",
        protocol_version=MODERN_VERSION,
        capabilities=capabilities if isinstance(capabilities, Mapping) else {},
        server_info=server_info if isinstance(server_info, Mapping) else {},
        instructions=instructions if isinstance(instructions, str) else None,
    )


def discover_verdict(result: Mapping[str, Any]) -> Verdict:
    """A ``DiscoverResult`` is modern evidence only if it offers a version we speak; one that lists only
    handshake-era versions is a legacy advertisement."""
    versions = result.get("supportedVersions")
    if isinstance(versions, list) and MODERN_VERSION in versions:
        return "modern"
    return "legacy"


def error_verdict(error: Any) -> Verdict:
    """The verdict from a JSON-RPC error answering the ``server/discover`` probe.

    ``-32022`` names the server's versions: none of ours but some modern ones means we cannot talk to it at all;
    only handshake-era ones means legacy. The other modern-only codes say "modern, but fix the request"; as we send
    a well-formed probe, the server is modern and the real requests will show what it wants. Any other error means
    legacy: the fallback is deliberately not keyed to one code.
    """
    if not isinstance(error, Mapping):
        return "legacy"
    code = error.get("code")
    if code == UNSUPPORTED_PROTOCOL_VERSION:
        data = error.get("data")
        supported = data.get("supported") if isinstance(data, Mapping) else None
        if isinstance(supported, list):
            if MODERN_VERSION in supported:
                return "modern"
            if supported and all(isinstance(v, str) and v < MODERN_VERSION for v in supported):
                return "legacy"
        return "unsupported"
    if code in _MODERN_ERRORS and code != METHOD_NOT_FOUND:
        return "modern"
    return "legacy"


def http_probe_verdict(status: int, body: Any) -> Verdict:
    """The verdict from the HTTP answer to the probe (``body`` is the decoded JSON, or ``None``).

    2xx: a ``DiscoverResult`` decides by its versions; an error body by ``error_verdict``. 400/404/405 with a
    recognised modern JSON-RPC error (``-32601`` included: a modern server answers unknown methods with 404) means
    modern; an empty or unrecognised body means legacy. Other statuses are not era evidence and fail the probe.
    """
    message = body if isinstance(body, Mapping) else {}
    if 200 <= status < 300:
        result = message.get("result")
        if isinstance(result, Mapping):
            return discover_verdict(result)
        return error_verdict(message.get("error"))
    if status in (400, 404, 405):
        error = message.get("error")
        if isinstance(error, Mapping) and error.get("code") == METHOD_NOT_FOUND and status == 404:
            return "modern"
        return error_verdict(error)
    return "unsupported"
