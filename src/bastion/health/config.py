"""The ``health`` section: how upstream health is probed and what a down upstream costs its tools.

    health:
      probe_interval: 10s          # active probe of a healthy upstream (0: passive signals only)
      recovery_interval: 1s        # probe cadence while an upstream is degraded or down
      probe_jitter: 0.1            # +-10% on every interval, so replicas do not probe in lockstep
      probe_timeout: 5s
      failures_to_down: 2          # consecutive failed calls/probes before an upstream is down
      hide_after: 30s              # down this long: its tools leave tools/list (null: never, calls still fail fast)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bastion.errors import ConfigError
from bastion.units import parse_duration

__all__ = ["HealthConfig"]

_KEYS = {"probe_interval", "recovery_interval", "probe_jitter", "probe_timeout", "failures_to_down", "hide_after"}


@dataclass(frozen=True, slots=True)
class HealthConfig:
    probe_interval_s: float = 10.0
    recovery_interval_s: float = 1.0
    probe_jitter: float = 0.1
    probe_timeout_s: float = 5.0
    failures_to_down: int = 2
    hide_after_s: float | None = 30.0

    @classmethod
    def from_mapping(cls, data: Any, path: str = "health") -> HealthConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", path=path)
        for key in data:
            if key not in _KEYS:
                raise ConfigError(f"unknown key {key!r} (allowed: {', '.join(sorted(_KEYS))})", path=f"{path}.{key}")
        jitter = data.get("probe_jitter", 0.1)
        if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter < 1:
            raise ConfigError("expected a fraction in [0, 1), e.g. 0.1 for +-10%", path=f"{path}.probe_jitter")
        failures = data.get("failures_to_down", 2)
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
            raise ConfigError("expected an integer >= 1", path=f"{path}.failures_to_down")
        hide = data.get("hide_after", 30.0)
        return cls(
            probe_interval_s=parse_duration(data.get("probe_interval", 10.0), f"{path}.probe_interval",
                                            allow_zero=True),
            recovery_interval_s=parse_duration(data.get("recovery_interval", 1.0), f"{path}.recovery_interval"),
            probe_jitter=float(jitter),
            probe_timeout_s=parse_duration(data.get("probe_timeout", 5.0), f"{path}.probe_timeout"),
            failures_to_down=failures,
            hide_after_s=None if hide is None else parse_duration(hide, f"{path}.hide_after", allow_zero=True),
        )
