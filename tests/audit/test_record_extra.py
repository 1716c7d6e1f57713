"""Every fact a guard leaves in ``CallRecord.extra`` reaches the audit record, or is declared as meant for
another reader: a new key in neither would be dropped from the record without a word (``ratelimit_degraded`` was,
while the docs promised it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from bastion.audit.record import NOT_RECORDED_EXTRA, RECORD_EXTRA, call_record
from bastion.call import CallContext, CallRecord
from bastion.principal import Principal
from bastion.tool_entry import ToolEntry
from tests.audit.helpers import assert_valid

SRC = Path(__file__).resolve().parents[2] / "src" / "bastion"
# record.extra["key"] = ..., extra["key"] = ..., or a notes/extra mapping handed on and written under a key.
_WRITES = re.compile(r"""(?:extra|notes)\[\s*["']([A-Za-z_]+)["']\s*\]\s*=""")


def keys_written() -> set[str]:
    return {m.group(1) for path in SRC.rglob("*.py") for m in _WRITES.finditer(path.read_text())}


def test_every_key_written_is_recorded_or_declared_for_another_reader() -> None:
    written = keys_written()
    assert {"ratelimit_degraded", "held_over", "flow"} <= written  # the scan finds what it must
    assert written <= RECORD_EXTRA | NOT_RECORDED_EXTRA, written - (RECORD_EXTRA | NOT_RECORDED_EXTRA)
    assert not RECORD_EXTRA & NOT_RECORDED_EXTRA


def _ctx() -> CallContext:
    entry = ToolEntry(public_name="up__t", upstream="up", original_name="t", definition={"name": "t"},
                      upstream_definition={"name": "t"})
    return CallContext(request_id="1", principal=Principal.anonymous(), tool=entry, arguments={})


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("ratelimit_degraded", True, True),
    ("refresh_wait_ms", 12.5, 12.5),
    ("held_over", ["per-user"], ["per-user"]),
])
def test_each_recorded_key_is_in_a_valid_record(key: str, value: Any, shown: Any) -> None:
    record = CallRecord()
    record.extra[key] = value
    doc = call_record(_ctx(), record, started_at=0.0, total_ms=1.0, outcome="allowed")
    assert doc[key] == shown
    assert_valid(doc)
