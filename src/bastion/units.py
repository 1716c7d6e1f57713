"""Durations and sizes as admins write them in config files. Pure; one definition for every section."""

from __future__ import annotations

import re
from typing import Any

from bastion.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
# SI prefixes are decimal (MB = 10^6), binary ones explicit (MiB = 2^20), as in every other tool admins use.
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
               "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3}


def parse_duration(value: Any, path: str, *, allow_zero: bool = False) -> float:
    """Seconds from ``30s``, ``500ms``, ``2m``, ``1h`` or a plain number of seconds.

    Zero is refused unless ``allow_zero`` (for settings where 0 means "off"); negatives always are.
    """
    if isinstance(value, bool):
        raise ConfigError("expected a duration such as 30s, 500ms or 2m", path=path)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ConfigError(f"expected a duration such as 30s, 500ms or 2m, got {value!r}", path=path)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigError("duration must be positive" + (" or 0" if allow_zero else ""), path=path)
    return seconds


def parse_size(value: Any, path: str) -> int:
    """Bytes from ``52428800``, ``50MB`` (10^6) or ``50MiB`` (2^20). Must be positive."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        size = int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()]
    else:
        raise ConfigError(f"invalid size {value!r}; expected bytes or e.g. '50MB', '10MiB'", path=path)
    if size <= 0:
        raise ConfigError("must be positive", path=path)
    return size
