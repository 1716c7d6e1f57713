"""OAuth 2.0 Protected Resource Metadata (RFC 9728), published when JWT auth is on. Pure."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bastion.auth.config import AuthConfig

WELL_KNOWN = "/.well-known/oauth-protected-resource"


def protected_resource_metadata(cfg: AuthConfig) -> dict[str, Any] | None:
    """The PRM document, or ``None`` when there is no authorization server to point clients at (no JWT)."""
    if cfg.jwt is None or cfg.resource is None:
        return None
    doc: dict[str, Any] = {
        "resource": cfg.resource,
        "authorization_servers": list(cfg.authorization_servers),
        "bearer_methods_supported": ["header"],
        "resource_name": "bastion",
    }
    if cfg.scopes_supported:
        doc["scopes_supported"] = list(cfg.scopes_supported)
    return doc


def metadata_url(cfg: AuthConfig) -> str | None:
    """The absolute PRM URL for ``resource_metadata=`` in 401 challenges: RFC 9728 §3.1 inserts the well-known
    segment between the resource's host and its path.
    """
    if cfg.jwt is None or cfg.resource is None:
        return None
    parts = urlsplit(cfg.resource)
    return urlunsplit((parts.scheme, parts.netloc, _suffixed(parts.path), "", ""))


def metadata_paths(cfg: AuthConfig, mcp_path: str) -> list[str]:
    """The request paths that serve the PRM document: the root well-known URI, the one suffixed with the MCP
    endpoint path, and the one named in challenges (suffixed with the resource's path) when that differs.
    Empty when no PRM is published.
    """
    if protected_resource_metadata(cfg) is None:
        return []
    paths = [WELL_KNOWN, _suffixed(mcp_path)]
    if cfg.resource is not None:
        paths.append(_suffixed(urlsplit(cfg.resource).path))
    return list(dict.fromkeys(paths))


def _suffixed(path: str) -> str:
    path = path.rstrip("/")
    if not path:
        return WELL_KNOWN
    return WELL_KNOWN + (path if path.startswith("/") else "/" + path)
