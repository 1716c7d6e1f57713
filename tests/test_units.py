from __future__ import annotations

from typing import Any

import pytest

from bastion.errors import ConfigError
from bastion.units import parse_duration, parse_size


@pytest.mark.parametrize(("value", "seconds"), [("30s", 30), ("500ms", 0.5), ("2m", 120), ("1h", 3600), (5, 5),
                                                (1.5, 1.5), ("10", 10), (" 3s ", 3)])
def test_durations(value: Any, seconds: float) -> None:
    assert parse_duration(value, "p") == seconds


@pytest.mark.parametrize("value", [0, -1, "-5s", True, "3 weeks", "5d", "soon", None])
def test_bad_durations_name_their_path(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "a.b")
    assert info.value.path == "a.b"


def test_zero_only_where_it_means_off() -> None:
    assert parse_duration(0, "p", allow_zero=True) == 0
    with pytest.raises(ConfigError):
        parse_duration(-1, "p", allow_zero=True)


@pytest.mark.parametrize(("value", "size"), [(512, 512), ("4MB", 4_000_000), ("4MiB", 4 * 1024**2), ("10kb", 10_000),
                                             ("1GiB", 1024**3)])
def test_sizes(value: Any, size: int) -> None:
    assert parse_size(value, "p") == size


@pytest.mark.parametrize("value", [0, -5, "lots", "4 TB", True, 1.5])
def test_bad_sizes(value: Any) -> None:
    with pytest.raises(ConfigError):
        parse_size(value, "p")
