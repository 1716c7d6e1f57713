from __future__ import annotations

from typing import Any

from bastion.auth import AuthConfig, hash_key, metadata_paths, metadata_url, protected_resource_metadata

JWT = {"issuer": "https://idp.example/realms/main", "jwks_url": "https://idp.example/jwks"}


def cfg(**extra: Any) -> AuthConfig:
    return AuthConfig.from_mapping({"jwt": JWT, **extra}, listen_host="0.0.0.0")


def test_document_shape() -> None:
    doc = protected_resource_metadata(cfg(resource="https://bastion.example/mcp"))
    assert doc == {
        "resource": "https://bastion.example/mcp",
        "authorization_servers": ["https://idp.example/realms/main"],
        "bearer_methods_supported": ["header"],
        "resource_name": "bastion",
    }


def test_document_with_scopes_and_explicit_servers() -> None:
    doc = protected_resource_metadata(cfg(resource="https://bastion.example/mcp", scopes_supported=["mcp:tools"],
                                          authorization_servers=["https://as1.example", "https://as2.example"]))
    assert doc is not None
    assert doc["authorization_servers"] == ["https://as1.example", "https://as2.example"]
    assert doc["scopes_supported"] == ["mcp:tools"]


def test_no_document_without_jwt() -> None:
    keys_only = AuthConfig.from_mapping({"api_keys": [{"id": "a", "hash": hash_key("k")}]}, listen_host="::")
    for c in (keys_only, AuthConfig.none()):
        assert protected_resource_metadata(c) is None
        assert metadata_url(c) is None
        assert metadata_paths(c, "/mcp") == []


def test_well_known_url_and_paths() -> None:
    c = cfg(resource="https://bastion.example/mcp")
    assert metadata_url(c) == "https://bastion.example/.well-known/oauth-protected-resource/mcp"
    assert metadata_paths(c, "/mcp") == ["/.well-known/oauth-protected-resource",
                                         "/.well-known/oauth-protected-resource/mcp"]
    # Behind a path-rewriting proxy the public path may differ from the local one: both are served.
    proxied = cfg(resource="https://gw.example/tools/mcp/")
    assert metadata_url(proxied) == "https://gw.example/.well-known/oauth-protected-resource/tools/mcp"
    assert metadata_paths(proxied, "/mcp") == ["/.well-known/oauth-protected-resource",
                                               "/.well-known/oauth-protected-resource/mcp",
                                               "/.well-known/oauth-protected-resource/tools/mcp"]
    root = cfg(resource="https://bastion.example")
    assert metadata_url(root) == "https://bastion.example/.well-known/oauth-protected-resource"
    assert metadata_paths(root, "/") == ["/.well-known/oauth-protected-resource"]
