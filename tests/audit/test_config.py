from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import yaml

from bastion.audit.config import (
    AuditConfig,
    FileSinkConfig,
    RedisStreamSinkConfig,
    StdoutSinkConfig,
    build_audit_log,
    parse_size,
)
from bastion.errors import ConfigError

EXAMPLE = """
audit:
  sinks:
    - stdout
    - {file: /var/log/bastion/audit.jsonl, max_bytes: 50MB, backups: 5}
    - {redis_stream: "bastion:audit", maxlen: 100000}
  required: false
  log_arguments: false
"""


def test_documented_example_parses() -> None:
    cfg = AuditConfig.from_mapping(yaml.safe_load(EXAMPLE)["audit"])
    assert cfg.sinks == (StdoutSinkConfig(), FileSinkConfig("/var/log/bastion/audit.jsonl", 50_000_000, 5),
                         RedisStreamSinkConfig("bastion:audit", 100_000))
    assert (cfg.required, cfg.log_arguments, cfg.needs_redis) == (False, False, True)


def test_defaults_are_stdout_fail_open() -> None:
    assert AuditConfig.from_mapping(None) == AuditConfig.from_mapping({}) == AuditConfig()
    assert AuditConfig().sinks == (StdoutSinkConfig(),)
    assert not AuditConfig().needs_redis


@pytest.mark.parametrize(("data", "path"), [
    ({"sink": []}, "audit.sink"),
    ({"sinks": "stdout"}, "audit.sinks"),
    ({"sinks": ["stderr"]}, "audit.sinks[0]"),
    ({"sinks": [{"file": "/a", "rotate": True}]}, "audit.sinks[0].rotate"),
    ({"sinks": [{"file": ""}]}, "audit.sinks[0].file"),
    ({"sinks": [{"file": "/a", "max_bytes": "lots"}]}, "audit.sinks[0].max_bytes"),
    ({"sinks": [{"file": "/a", "max_bytes": 0}]}, "audit.sinks[0].max_bytes"),
    ({"sinks": [{"file": "/a", "backups": -1}]}, "audit.sinks[0].backups"),
    ({"sinks": [{"redis_stream": "k", "maxlen": 0}]}, "audit.sinks[0].maxlen"),
    ({"sinks": [{"redis_stream": "k", "timeout_ms": "1s"}]}, "audit.sinks[0].timeout_ms"),
    ({"sinks": ["stdout", "stdout"]}, "audit.sinks[1]"),
    ({"sinks": [], "required": True}, "audit.required"),
    ({"required": "yes"}, "audit.required"),
    ({"log_arguments": 1}, "audit.log_arguments"),
    ({"failure_report_interval_s": -1}, "audit.failure_report_interval_s"),
])
def test_invalid_config_names_the_key(data: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        AuditConfig.from_mapping(data)
    assert info.value.path == path


def test_embedded_path_prefix() -> None:
    with pytest.raises(ConfigError) as info:
        AuditConfig.from_mapping({"bogus": 1}, path="gateway.audit")
    assert info.value.path == "gateway.audit.bogus"


@pytest.mark.parametrize(("text", "size"), [(1024, 1024), ("50MB", 50_000_000), ("10MiB", 10 * 2**20),
                                            ("1 GiB", 2**30), ("512k", 512_000), ("7", 7)])
def test_sizes(text: Any, size: int) -> None:
    assert parse_size(text, "x") == size


async def test_build_audit_log(tmp_path: Path) -> None:
    cfg = AuditConfig.from_mapping({"sinks": ["stdout", {"file": str(tmp_path / "a.jsonl"), "max_bytes": "1MiB"},
                                              {"redis_stream": "k"}], "required": True, "log_arguments": True})
    with pytest.raises(ConfigError) as info:
        build_audit_log(cfg, None)
    assert info.value.path == "audit.sinks[2].redis_stream"
    client = redis.asyncio.Redis()  # never connects: building a sink does no I/O
    audit = build_audit_log(cfg, client)
    assert [s.name for s in audit.sinks] == ["stdout", f"file:{tmp_path / 'a.jsonl'}", "redis:k"]
    assert (audit.required, audit.log_arguments) == (True, True)
    await audit.close()
    await client.aclose()
