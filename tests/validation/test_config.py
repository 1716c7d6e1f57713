from __future__ import annotations

from typing import Any

import pytest

from bastion.errors import ConfigError
from bastion.validation import SchemaLimits, ValidationConfig


def test_defaults() -> None:
    config = ValidationConfig.from_mapping({})
    assert config.output == "strict"
    assert config.limits == SchemaLimits()
    assert config.mode_for("any", "tool") == "strict"


def test_precedence_tool_then_upstream_then_global() -> None:
    config = ValidationConfig.from_mapping({
        "output": "warn",
        "limits": {"max_schema_bytes": 1000, "max_errors": 3},
        "upstreams": {"files": {"output": "strict", "tools": {"read": "off"}}, "web": {"tools": {"get": "strict"}}},
    })
    assert config.limits.max_schema_bytes == 1000
    assert config.limits.max_errors == 3
    assert config.limits.max_argument_depth == SchemaLimits().max_argument_depth
    assert config.mode_for("files", "read") == "off"
    assert config.mode_for("files", "write") == "strict"
    assert config.mode_for("web", "get") == "strict"
    assert config.mode_for("web", "post") == "warn"
    assert config.mode_for("other", "x") == "warn"


@pytest.mark.parametrize(("data", "path"), [
    ({"outputs": "strict"}, "validation.outputs"),
    ({"output": "loose"}, "validation.output"),
    ({"limits": {"max_schema_bytes": 0}}, "validation.limits.max_schema_bytes"),
    ({"limits": {"max_errors": True}}, "validation.limits.max_errors"),
    ({"limits": {"max_argument_depth": 1000}}, "validation.limits.max_argument_depth"),
    ({"limits": {"max_regex": 1}}, "validation.limits.max_regex"),
    ({"limits": []}, "validation.limits"),
    ({"upstreams": {"files": {"mode": "warn"}}}, "validation.upstreams.files.mode"),
    ({"upstreams": {"files": {"tools": {"read": "maybe"}}}}, "validation.upstreams.files.tools.read"),
    ({"upstreams": {"files": "warn"}}, "validation.upstreams.files"),
])
def test_rejects_bad_config_with_its_path(data: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        ValidationConfig.from_mapping(data)
    assert info.value.path == path


def test_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        ValidationConfig.from_mapping([], path="gateway.validation")  # type: ignore[arg-type]
