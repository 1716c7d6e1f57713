"""The ``tracing:`` section: where spans go, under which service name, how many are kept.

Pure parsing; the OpenTelemetry SDK is not imported here. Every key is optional: a present block (even ``{}``)
turns tracing on, and what it leaves out comes from the standard ``OTEL_*`` variables the SDK reads
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER``…). Without the block, tracing is on only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set; ``OTEL_SDK_DISABLED=true`` turns it off either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bastion.errors import ConfigError

__all__ = ["TracingConfig"]

_KEYS = {"enabled", "otlp_endpoint", "service_name", "sample_ratio", "headers"}
_ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


@dataclass(frozen=True, slots=True)
class TracingConfig:
    # None: no block in the file (tracing follows the OTEL_* variables); True/False: the block decides.
    enabled: bool | None = None
    # The OTLP/HTTP traces URL. A bare base URL (no path) gets ``/v1/traces``, as OTEL_EXPORTER_OTLP_ENDPOINT does.
    otlp_endpoint: str | None = None
    service_name: str | None = None
    # Fraction of new traces kept (0..1), parent-based: a client's sampled flag is honoured.
    sample_ratio: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Any, path: str) -> TracingConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError("must be a mapping", path=path)
        unknown = sorted(set(map(str, data)) - _KEYS)
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_KEYS))})",
                              path=f"{path}.{unknown[0]}")
        enabled = data.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError("must be true or false", path=f"{path}.enabled")
        endpoint = data.get("otlp_endpoint")
        if endpoint is not None:
            if not isinstance(endpoint, str) or urlsplit(endpoint).scheme not in ("http", "https") \
                    or not urlsplit(endpoint).hostname:
                raise ConfigError("must be an http(s) URL such as http://otel-collector:4318",
                                  path=f"{path}.otlp_endpoint")
            endpoint = traces_url(endpoint)
        service = data.get("service_name")
        if service is not None and (not isinstance(service, str) or not service.strip()):
            raise ConfigError("must be a non-empty string", path=f"{path}.service_name")
        ratio = data.get("sample_ratio")
        if ratio is not None:
            if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0.0 <= float(ratio) <= 1.0:
                raise ConfigError("must be a number from 0 to 1", path=f"{path}.sample_ratio")
            ratio = float(ratio)
        headers = data.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in headers.items()):
            raise ConfigError("must map header names to strings", path=f"{path}.headers")
        return cls(enabled=enabled, otlp_endpoint=endpoint, service_name=service, sample_ratio=ratio,
                   headers=dict(headers))

    def active(self, env: Mapping[str, str]) -> bool:
        """Whether spans are made and exported at all."""
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return False
        if self.enabled is not None:
            return self.enabled
        return any(env.get(name) for name in _ENDPOINT_ENV)


def traces_url(endpoint: str) -> str:
    """``http://collector:4318`` → ``http://collector:4318/v1/traces``; a URL with a path is used as written."""
    if urlsplit(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint
