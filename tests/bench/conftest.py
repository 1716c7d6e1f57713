from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the scripts in bench/ importable: they import each other as top-level modules."""
    monkeypatch.syspath_prepend(str(BENCH))
