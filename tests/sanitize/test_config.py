from __future__ import annotations

from typing import Any

import pytest

from bastion.errors import ConfigError
from bastion.sanitize.config import DEFAULT_MAX_ITEM_BYTES, SanitizeConfig

CONFIG: dict[str, Any] = {
    "injection": "neutralise",
    "max_item_bytes": 1000,
    "secrets": {"extra_rules": [{"id": "acme-key", "pattern": r"acme_[0-9a-f]{16}", "description": "ACME"}]},
    "upstreams": {
        "github": {"injection": "block", "secrets": {"disable": ["jwt"]},
                   "tools": {"search": {"enabled": False}, "get_file": {"max_item_bytes": 50,
                                                                      "allowed_mime_types": ["image/*"]}}},
        "files": {"max_result_bytes": 2000},
    },
}


def test_defaults_are_on() -> None:
    cfg = SanitizeConfig.from_mapping({})
    p = cfg.for_tool("any", "tool")
    assert p.enabled
    assert p.injection == "flag"
    assert p.max_item_bytes == DEFAULT_MAX_ITEM_BYTES
    assert p.mime_allowed("image/png; charset=binary")
    assert not p.mime_allowed("image/svg+xml")
    assert SanitizeConfig.from_mapping(None).default.enabled


def test_merging_global_upstream_tool() -> None:
    cfg = SanitizeConfig.from_mapping(CONFIG)
    other = cfg.for_tool("other", "x")
    assert (other.injection, other.max_item_bytes) == ("neutralise", 1000)
    gh = cfg.for_tool("github", "list")
    assert (gh.injection, gh.max_item_bytes) == ("block", 1000)
    assert "jwt" not in gh.redactor.rule_ids
    assert "acme-key" in gh.redactor.rule_ids
    assert not cfg.for_tool("github", "search").enabled
    get_file = cfg.for_tool("github", "get_file")
    assert (get_file.injection, get_file.max_item_bytes) == ("block", 50)
    assert get_file.mime_allowed("image/svg+xml")
    assert "jwt" not in get_file.redactor.rule_ids
    assert cfg.for_tool("files", "read").max_result_bytes == 2000
    assert cfg.for_upstream("files") is cfg.for_tool("files", "read")


def test_redactors_are_shared_when_secrets_do_not_change() -> None:
    cfg = SanitizeConfig.from_mapping(CONFIG)
    assert cfg.for_tool("files", "x").redactor is cfg.default.redactor
    assert cfg.for_tool("github", "get_file").redactor is cfg.for_tool("github", "x").redactor


@pytest.mark.parametrize(("data", "path"), [
    ({"enable": True}, "sanitize"),
    ({"enabled": "yes"}, "sanitize.enabled"),
    ({"injection": "drop"}, "sanitize.injection"),
    ({"max_result_bytes": 0}, "sanitize.max_result_bytes"),
    ({"max_item_bytes": True}, "sanitize.max_item_bytes"),
    ({"allowed_mime_types": ["png"]}, "sanitize.allowed_mime_types"),
    ({"upstreams": []}, "sanitize.upstreams"),
    ({"upstreams": {"gh": {"tool": {}}}}, "sanitize.upstreams.gh"),
    ({"upstreams": {"gh": {"tools": {"t": {"tools": {}}}}}}, "sanitize.upstreams.gh.tools.t"),
    ({"upstreams": {"gh": {"secrets": {"disable": ["nope"]}}}}, "sanitize.upstreams.gh.secrets.disable"),
])
def test_config_errors_name_the_key(data: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        SanitizeConfig.from_mapping(data)
    assert info.value.path == path
