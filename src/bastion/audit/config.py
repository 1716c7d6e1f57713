"""The ``audit:`` config section, and building the ``AuditLog`` it describes.

::

    audit:
      sinks:
        - stdout
        - {file: /var/log/bastion/audit.jsonl, max_bytes: 50MB, backups: 5}
        - {redis_stream: "bastion:audit", maxlen: 100000}
      required: false
      log_arguments: false
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from bastion.audit.log import AuditLog
from bastion.audit.sinks import AuditSink, FileSink, RedisStreamSink, StdoutSink
from bastion.errors import ConfigError
from bastion.units import parse_size

__all__ = ["AuditConfig", "FileSinkConfig", "RedisStreamSinkConfig", "SinkConfig", "StdoutSinkConfig",
           "build_audit_log", "parse_size"]

_TOP_KEYS = frozenset({"sinks", "required", "log_arguments", "failure_report_interval_s"})
_FILE_KEYS = frozenset({"file", "max_bytes", "backups", "fsync"})
_REDIS_KEYS = frozenset({"redis_stream", "maxlen", "timeout_ms"})


@dataclass(frozen=True, slots=True)
class StdoutSinkConfig:
    pass


@dataclass(frozen=True, slots=True)
class FileSinkConfig:
    path: str
    max_bytes: int = 50 * 1000**2
    backups: int = 5
    fsync: bool = False


@dataclass(frozen=True, slots=True)
class RedisStreamSinkConfig:
    key: str
    maxlen: int = 100_000
    timeout_ms: int = 2000


SinkConfig = StdoutSinkConfig | FileSinkConfig | RedisStreamSinkConfig


@dataclass(frozen=True, slots=True)
class AuditConfig:
    sinks: tuple[SinkConfig, ...] = (StdoutSinkConfig(),)
    required: bool = False
    log_arguments: bool = False
    failure_report_interval_s: float = 60.0

    @property
    def needs_redis(self) -> bool:
        return any(isinstance(s, RedisStreamSinkConfig) for s in self.sinks)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, path: str = "audit") -> AuditConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError("must be a mapping", path=path)
        _reject_unknown(data, _TOP_KEYS, path)
        sinks_raw = data.get("sinks", ["stdout"])
        if not isinstance(sinks_raw, list):
            raise ConfigError("must be a list of sinks", path=f"{path}.sinks")
        sinks = tuple(_parse_sink(item, f"{path}.sinks[{i}]") for i, item in enumerate(sinks_raw))
        names = [_sink_identity(s) for s in sinks]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ConfigError(f"duplicate sink {name}", path=f"{path}.sinks[{i}]")
        required = _bool(data.get("required", False), f"{path}.required")
        if required and not sinks:
            raise ConfigError("required is true but no sink is configured", path=f"{path}.required")
        interval = data.get("failure_report_interval_s", 60.0)
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
            raise ConfigError("must be a non-negative number of seconds", path=f"{path}.failure_report_interval_s")
        return cls(sinks=sinks, required=required,
                   log_arguments=_bool(data.get("log_arguments", False), f"{path}.log_arguments"),
                   failure_report_interval_s=float(interval))


def build_audit_log(cfg: AuditConfig, redis_client: redis.asyncio.Redis | None, *,
                    on_sink_failure: Callable[[str], None] | None = None) -> AuditLog:
    """The ``AuditLog`` ``cfg`` describes. A Redis stream sink needs ``redis_client`` (the gateway's own)."""
    sinks: list[AuditSink] = []
    for i, sink in enumerate(cfg.sinks):
        if isinstance(sink, StdoutSinkConfig):
            sinks.append(StdoutSink())
        elif isinstance(sink, FileSinkConfig):
            sinks.append(FileSink(sink.path, max_bytes=sink.max_bytes, backups=sink.backups, fsync=sink.fsync))
        else:
            if redis_client is None:
                raise ConfigError("a redis_stream sink needs a Redis connection (set redis.url)",
                                  path=f"audit.sinks[{i}].redis_stream")
            sinks.append(RedisStreamSink(redis_client, sink.key, maxlen=sink.maxlen,
                                         timeout_s=sink.timeout_ms / 1000))
    return AuditLog(sinks, required=cfg.required, log_arguments=cfg.log_arguments,
                    report_interval_s=cfg.failure_report_interval_s, on_sink_failure=on_sink_failure)




def _parse_sink(item: Any, path: str) -> SinkConfig:
    if item == "stdout":
        return StdoutSinkConfig()
    if isinstance(item, Mapping) and "file" in item:
        _reject_unknown(item, _FILE_KEYS, path)
        file_path = item["file"]
        if not isinstance(file_path, str) or not file_path:
            raise ConfigError("must be a file path", path=f"{path}.file")
        backups = item.get("backups", 5)
        if isinstance(backups, bool) or not isinstance(backups, int) or not 0 <= backups <= 1000:
            raise ConfigError("must be an integer between 0 and 1000", path=f"{path}.backups")
        return FileSinkConfig(path=file_path, max_bytes=parse_size(item.get("max_bytes", "50MB"), f"{path}.max_bytes"),
                              backups=backups, fsync=_bool(item.get("fsync", False), f"{path}.fsync"))
    if isinstance(item, Mapping) and "redis_stream" in item:
        _reject_unknown(item, _REDIS_KEYS, path)
        key = item["redis_stream"]
        if not isinstance(key, str) or not key:
            raise ConfigError("must be a stream key", path=f"{path}.redis_stream")
        return RedisStreamSinkConfig(key=key, maxlen=_positive_int(item.get("maxlen", 100_000), f"{path}.maxlen"),
                                     timeout_ms=_positive_int(item.get("timeout_ms", 2000), f"{path}.timeout_ms"))
    raise ConfigError(f"unknown sink {item!r}; expected 'stdout', {{file: PATH}} or {{redis_stream: KEY}}",
                      path=path)


def _sink_identity(sink: SinkConfig) -> str:
    if isinstance(sink, FileSinkConfig):
        return f"file:{sink.path}"
    if isinstance(sink, RedisStreamSinkConfig):
        return f"redis:{sink.key}"
    return "stdout"


def _reject_unknown(data: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    for key in data:
        if key not in allowed:
            raise ConfigError(f"unknown key {key!r}; expected one of {', '.join(sorted(allowed))}",
                              path=f"{path}.{key}")


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError("must be true or false", path=path)
    return value


def _positive_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError("must be a positive integer", path=path)
    return value
