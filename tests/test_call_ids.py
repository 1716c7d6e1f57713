"""Call ids: 16 hex digits each, fresh across block refills, and two gateways never share a sequence."""

from __future__ import annotations

import re

import pytest

from bastion.call_ids import CallIds


def test_ids_are_16_hex_digits_and_distinct_across_refills() -> None:
    ids = CallIds(block_ids=7)  # a small block, so the run crosses many refills
    drawn = [ids.next() for _ in range(1000)]
    assert all(re.fullmatch(r"[0-9a-f]{16}", rid) for rid in drawn)
    assert len(set(drawn)) == len(drawn)


def test_two_pools_draw_different_ids() -> None:
    assert len({CallIds().next() for _ in range(50)}) == 50


def test_a_block_must_hold_an_id() -> None:
    with pytest.raises(ValueError):
        CallIds(block_ids=0)
