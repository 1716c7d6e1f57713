from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bastion.auth import AuthConfig, hash_key, is_loopback_host
from bastion.errors import ConfigError

HASH = hash_key("bst_example")
JWT = {"issuer": "https://idp.example", "jwks_url": "https://idp.example/jwks"}


def parse(data: Any, host: str = "0.0.0.0", **kw: Any) -> AuthConfig:
    return AuthConfig.from_mapping(data, listen_host=host, **kw)


def error(data: Any, host: str = "0.0.0.0", **kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(data, host, **kw)
    return info.value


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_absent_auth_on_loopback_is_anonymous(host: str) -> None:
    assert is_loopback_host(host)
    assert parse(None, host).mode == "none"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "bastion.example", "128.0.0.1"])
def test_absent_auth_on_other_hosts_is_refused(host: str) -> None:
    err = error(None, host)
    assert err.path == "auth"
    assert "auth: none" in err.message


def test_explicit_none_is_allowed_anywhere() -> None:
    cfg = parse("none", "0.0.0.0")
    assert cfg.mode == "none"
    assert cfg.api_keys == ()
    assert cfg.jwt is None


def test_api_key_entry() -> None:
    cfg = parse({"api_keys": [{"id": "alice", "hash": HASH.upper().replace("SHA256", "sha256"),
                               "groups": ["eng"], "attributes": {"team": "x"}}]})
    (entry,) = cfg.api_keys
    assert cfg.mode == "enabled"
    assert (entry.id, entry.hash) == ("alice", HASH)
    assert (entry.groups, dict(entry.attributes)) == (frozenset({"eng"}), {"team": "x"})


@pytest.mark.parametrize(("entry", "path"), [
    ({"id": "alice", "key": "bst_secret"}, "auth.api_keys[0].key"),
    ({"id": "alice", "hash": "bst_secret"}, "auth.api_keys[0].hash"),
    ({"id": "alice", "hash": "sha256:abc"}, "auth.api_keys[0].hash"),
    ({"id": "alice", "hash": "md5:" + "0" * 64}, "auth.api_keys[0].hash"),
    ("bst_secret", "auth.api_keys[0]"),
])
def test_plaintext_or_malformed_keys_are_refused(entry: Any, path: str) -> None:
    err = error({"api_keys": [entry]})
    assert err.path == path
    assert "bst_secret" not in str(err)


@pytest.mark.parametrize(("data", "path"), [
    ({"api_keys": [], "bogus": 1}, "auth.bogus"),
    ({"api_keys": [{"id": "a", "hash": HASH, "role": "x"}]}, "auth.api_keys[0].role"),
    ({"jwt": {**JWT, "audiences": ["x"]}, "resource": "https://b.example/mcp"}, "auth.jwt.audiences"),
    ({"api_keys": [{"hash": HASH}]}, "auth.api_keys[0].id"),
    ({"api_keys": [{"id": "a b", "hash": HASH}]}, "auth.api_keys[0].id"),
    ({"api_keys": [{"id": "a\n", "hash": HASH}]}, "auth.api_keys[0].id"),
    ({"api_keys": [{"id": "a", "hash": HASH, "groups": "eng"}]}, "auth.api_keys[0].groups"),
    ({"api_keys": {"id": "a"}}, "auth.api_keys"),
    ("anonymous", "auth"),
    ({"jwt": JWT, "resource": "https://b.example/mcp", "scopes_supported": ['a"b']}, "auth.scopes_supported[0]"),
    ({"jwt": JWT, "resource": 'https://b.example/m"cp'}, "auth.resource"),
    ({}, "auth"),
    ({"api_keys": []}, "auth"),
])
def test_structural_errors_name_the_path(data: Any, path: str) -> None:
    assert error(data).path == path


def test_duplicate_ids_and_hashes_are_refused() -> None:
    other = hash_key("bst_other")
    assert "duplicate" in error({"api_keys": [{"id": "a", "hash": HASH}, {"id": "a", "hash": other}]}).message
    assert "same hash" in error({"api_keys": [{"id": "a", "hash": HASH}, {"id": "b", "hash": HASH}]}).message


def test_jwt_defaults_and_audience_from_resource() -> None:
    cfg = parse({"jwt": JWT, "resource": "https://bastion.example/mcp"})
    assert cfg.jwt is not None
    assert cfg.jwt.audience == ("https://bastion.example/mcp",)
    assert cfg.jwt.algorithms == ("RS256",)
    assert (cfg.jwt.groups_claim, cfg.jwt.principal_claim) == ("groups", "sub")
    assert (cfg.jwt.leeway_s, cfg.jwt.jwks_cache_ttl_s) == (30.0, 300.0)
    assert cfg.authorization_servers == ("https://idp.example",)


def test_jwt_full() -> None:
    cfg = parse({"jwt": {**JWT, "audience": ["api://bastion"], "algorithms": ["ES256", "RS256"],
                         "groups_claim": "roles", "principal_claim": "email", "leeway": "5s",
                         "jwks_cache_ttl": "10m"},
                 "resource": "https://bastion.example/mcp", "authorization_servers": ["https://as.example"],
                 "scopes_supported": ["mcp:tools"]})
    assert cfg.jwt is not None
    assert cfg.jwt.audience == ("api://bastion",)
    assert cfg.jwt.algorithms == ("ES256", "RS256")
    assert (cfg.jwt.leeway_s, cfg.jwt.jwks_cache_ttl_s) == (5.0, 600.0)
    assert cfg.authorization_servers == ("https://as.example",)
    assert cfg.scopes_supported == ("mcp:tools",)


@pytest.mark.parametrize("alg", ["none", "HS256", "HS512", "rs256"])
def test_symmetric_and_none_algorithms_are_refused(alg: str) -> None:
    err = error({"jwt": {**JWT, "algorithms": [alg]}, "resource": "https://b.example/mcp"})
    assert err.path == "auth.jwt.algorithms"


def test_jwt_requires_resource_and_https_jwks() -> None:
    assert error({"jwt": JWT}).path == "auth.jwt.audience"
    assert error({"jwt": {**JWT, "audience": "x"}}).path == "auth.resource"
    plain = {**JWT, "jwks_url": "http://idp.example/jwks"}
    assert error({"jwt": plain, "resource": "https://b.example/mcp"}).path == "auth.jwt.jwks_url"
    loopback = {**JWT, "jwks_url": "http://127.0.0.1:8080/jwks"}
    assert parse({"jwt": loopback, "resource": "https://b.example/mcp"}).jwt is not None
    assert error({"jwt": JWT, "resource": "bastion/mcp"}).path == "auth.resource"


def test_keys_file_relative_to_base_dir(tmp_path: Path) -> None:
    (tmp_path / "keys.yaml").write_text(f"api_keys:\n  - id: bob\n    hash: {HASH}\n    groups: [ops]\n")
    (tmp_path / "list.yaml").write_text(f"- id: carol\n  hash: {hash_key('bst_c')}\n")
    cfg = parse({"api_keys": [{"id": "alice", "hash": hash_key("bst_a")}], "api_keys_file": "keys.yaml"},
                base_dir=tmp_path)
    assert [e.id for e in cfg.api_keys] == ["alice", "bob"]
    assert parse({"api_keys_file": str(tmp_path / "list.yaml")}).api_keys[0].id == "carol"


def test_keys_file_errors(tmp_path: Path) -> None:
    assert "cannot read" in error({"api_keys_file": "missing.yaml"}, base_dir=tmp_path).message
    (tmp_path / "bad.yaml").write_text("- id: x\n  hash: [unclosed\n")
    bad = error({"api_keys_file": "bad.yaml"}, base_dir=tmp_path)
    assert bad.source == str(tmp_path / "bad.yaml")
    assert bad.line is not None
    (tmp_path / "plain.yaml").write_text("- id: x\n  key: bst_secret\n")
    plain = error({"api_keys_file": "plain.yaml"}, base_dir=tmp_path)
    assert plain.source == str(tmp_path / "plain.yaml")
    assert plain.path == "api_keys[0].key"
