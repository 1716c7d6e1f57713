from __future__ import annotations

from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.pinning.config import PinningConfig


def test_defaults() -> None:
    cfg = PinningConfig.from_mapping({})
    assert cfg == PinningConfig(enabled=True, store=None, file=Path("var/pins.json"), trusted_upstreams=frozenset())
    assert PinningConfig.from_mapping(None) == cfg
    assert cfg.store_kind(have_redis=True) == "redis"
    assert cfg.store_kind(have_redis=False) == "file"


def test_full_section() -> None:
    cfg = PinningConfig.from_mapping({"enabled": False, "store": "file", "file": "/srv/pins.json",
                                      "trusted_upstreams": ["internal"]})
    assert cfg == PinningConfig(enabled=False, store="file", file=Path("/srv/pins.json"),
                                trusted_upstreams=frozenset({"internal"}))
    assert cfg.store_kind(have_redis=True) == "file"
    assert cfg.with_trusted(["docs"]).trusted_upstreams == {"internal", "docs"}
    assert cfg.is_trusted("internal")
    assert not cfg.is_trusted("docs")


@pytest.mark.parametrize(("data", "path", "message"), [
    ({"enable": True}, "pinning.enable", "unknown key 'enable'"),
    ({"enabled": "yes"}, "pinning.enabled", "expected true or false"),
    ({"store": "s3"}, "pinning.store", "expected 'file' or 'redis'"),
    ({"file": ""}, "pinning.file", "expected a file path"),
    ({"trusted_upstreams": "internal"}, "pinning.trusted_upstreams", "expected a list"),
    ([], "pinning", "expected a mapping"),
])
def test_errors_name_the_key(data: object, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        PinningConfig.from_mapping(data)  # type: ignore[arg-type]
    assert info.value.path == path
    assert message in info.value.message


def test_redis_store_needs_redis() -> None:
    cfg = PinningConfig.from_mapping({"store": "redis"}, path="gateway.pinning")
    assert cfg.store_kind(have_redis=True) == "redis"
    with pytest.raises(ConfigError) as info:
        cfg.store_kind(have_redis=False, path="gateway.pinning")
    assert info.value.path == "gateway.pinning.store"
