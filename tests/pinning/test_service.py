from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bastion.pinning import (
    CandidateMismatch,
    FilePinStore,
    NothingPending,
    Pinning,
    PinningConfig,
    PinNotFound,
    fingerprint,
)
from bastion.pinning.view_step import quarantine_reason
from tests.pinning.tools import POISONED, list_dir, read_file


def make(tmp_path: Path, **cfg: object) -> Pinning:
    return Pinning(FilePinStore(tmp_path / "pins.json"), PinningConfig.from_mapping(cfg),
                   clock=lambda: datetime(2026, 3, 1, 12, 0, tzinfo=UTC))


async def test_a_first_listing_logs_one_info_line_per_upstream_and_each_tool_at_debug(tmp_path: Path) -> None:
    pinning = make(tmp_path)
    tools = [{**read_file(), "name": f"t{i:02d}"} for i in range(25)]
    root = logging.getLogger()
    level = root.level
    for debug in (False, True):
        root.setLevel(logging.DEBUG if debug else logging.INFO)
        try:
            with capture_logs() as logs:
                await pinning.reconcile(f"up-{debug}", tools)
        finally:
            root.setLevel(level)
        [summary] = [e for e in logs if e["event"] == "pin.pinned"]
        assert summary == {"event": "pin.pinned", "log_level": "info", "upstream": f"up-{debug}", "count": 25,
                           "tools": [f"t{i:02d}" for i in range(20)]}
        new = [e for e in logs if e["event"] == "pin.new"]
        assert len(new) == (25 if debug else 0)
        assert all(e["log_level"] == "debug" and e["action"] == "pinned" for e in new)
    # Nothing new the next time: no line at all.
    with capture_logs() as logs:
        await pinning.reconcile("up-False", tools)
    assert logs == []


async def test_first_listing_pins_and_a_change_quarantines(tmp_path: Path) -> None:
    pinning = make(tmp_path)
    first = await pinning.reconcile("files", [read_file(), list_dir()])
    assert first.quarantined == frozenset()
    assert [e.event for e in first.events] == ["pin.new", "pin.new"]
    assert not first.degraded

    changed = await pinning.reconcile("files", [read_file(POISONED), list_dir()])
    assert changed.quarantined == {"read_file"}
    (drift,) = changed.events
    assert drift.to_log() == {
        "event": "pin.drift", "action": "quarantined", "upstream": "files", "tool": "read_file",
        "old_fingerprint": fingerprint(read_file()), "new_fingerprint": fingerprint(read_file(POISONED)),
        "diff": [f'description: "Reads a file" -> "{POISONED}"'],
    }
    assert await pinning.diff("files", "read_file") == [f'description: "Reads a file" -> "{POISONED}"']
    quarantined = await pinning.list(status="quarantined")
    assert [(p.upstream, p.pin.tool) for p in quarantined] == [("files", "read_file")]
    assert [p.pin.tool for p in await pinning.list("files")] == ["list_dir", "read_file"]
    assert await pinning.list("other") == []


async def test_approve_releases_the_tool(tmp_path: Path) -> None:
    pinning = make(tmp_path)
    await pinning.reconcile("files", [read_file()])
    await pinning.reconcile("files", [read_file(POISONED)])
    event = await pinning.approve("files", "read_file", "alice", fingerprint=fingerprint(read_file(POISONED))[:19])
    assert (event.event, event.by, event.new_fingerprint) == ("pin.approved", "alice",
                                                              fingerprint(read_file(POISONED)))
    pin = await pinning.get("files", "read_file")
    assert (pin.status, pin.approved_by, pin.approved_at, pin.candidate) == (
        "approved", "alice", "2026-03-01T12:00:00Z", None)
    outcome = await pinning.reconcile("files", [read_file(POISONED)])
    assert outcome.quarantined == frozenset()
    assert outcome.events == ()
    with pytest.raises(NothingPending):
        await pinning.approve("files", "read_file", "alice")
    with pytest.raises(NothingPending):
        await pinning.diff("files", "read_file")


async def test_reject_keeps_the_tool_quarantined(tmp_path: Path) -> None:
    pinning = make(tmp_path)
    await pinning.reconcile("files", [read_file()])
    await pinning.reconcile("files", [read_file(POISONED)])
    event = await pinning.reject("files", "read_file", "bob")
    assert (event.event, event.action, event.by) == ("pin.rejected", "rejected", "bob")
    pin = await pinning.get("files", "read_file")
    assert pin.candidate is not None
    assert (pin.status, pin.candidate.rejected_by) == ("quarantined", "bob")
    again = await pinning.reconcile("files", [read_file(POISONED)])
    assert (again.quarantined, again.events) == (frozenset({"read_file"}), ())
    # The admin may still approve a rejected change.
    await pinning.approve("files", "read_file", "alice")
    assert (await pinning.reconcile("files", [read_file(POISONED)])).quarantined == frozenset()


async def test_approving_a_change_other_than_the_reviewed_one_is_refused(tmp_path: Path) -> None:
    pinning = make(tmp_path)
    await pinning.reconcile("files", [read_file()])
    await pinning.reconcile("files", [read_file(POISONED)])
    reviewed = fingerprint(read_file(POISONED))
    await pinning.reconcile("files", [read_file(POISONED + " Even worse.")])
    with pytest.raises(CandidateMismatch, match="review it again"):
        await pinning.approve("files", "read_file", "alice", fingerprint=reviewed)
    assert (await pinning.get("files", "read_file")).status == "quarantined"


async def test_unknown_pins(tmp_path: Path) -> None:
    pinning = make(tmp_path)
    with pytest.raises(PinNotFound, match="no pin for tool 'nope' of upstream 'files'"):
        await pinning.approve("files", "nope", "alice")
    with pytest.raises(PinNotFound):
        await pinning.reject("files", "nope", "alice")
    with pytest.raises(PinNotFound):
        await pinning.diff("files", "nope")


async def test_trusted_upstreams_auto_approve_but_audit(tmp_path: Path) -> None:
    pinning = make(tmp_path, trusted_upstreams=["internal"])
    await pinning.reconcile("internal", [read_file()])
    await pinning.reconcile("files", [read_file()])
    trusted = await pinning.reconcile("internal", [read_file(POISONED)])
    assert trusted.quarantined == frozenset()
    assert [(e.event, e.action) for e in trusted.events] == [("pin.drift", "auto_approved")]
    assert (await pinning.get("internal", "read_file")).approved_by == "trusted-upstream"
    untrusted = await pinning.reconcile("files", [read_file(POISONED)])
    assert untrusted.quarantined == {"read_file"}


async def test_trusted_set_from_upstream_sections(tmp_path: Path) -> None:
    pinning = Pinning(FilePinStore(tmp_path / "pins.json"), PinningConfig().with_trusted(["internal"]))
    await pinning.reconcile("internal", [read_file()])
    assert (await pinning.reconcile("internal", [read_file(POISONED)])).quarantined == frozenset()


async def test_disabled_pinning_touches_nothing(tmp_path: Path) -> None:
    pinning = make(tmp_path, enabled=False)
    outcome = await pinning.reconcile("files", [read_file()])
    assert (outcome.quarantined, outcome.events) == (frozenset(), ())
    assert not (tmp_path / "pins.json").exists()


async def test_each_quarantine_names_the_decision_that_made_it(tmp_path: Path) -> None:
    """A tool listed twice with different definitions was quarantined as pin drift, though nothing was pinned:
    the reason sent operators looking for an approval that did not exist."""
    pinning = make(tmp_path)
    first = await pinning.reconcile("fs", [read_file(), list_dir()])
    assert not first.quarantined
    duplicated = await pinning.reconcile("fs", [read_file(), list_dir(), {**list_dir(), "description": "other"}])
    assert duplicated.quarantined == {"list_dir"}
    assert "more than once" in quarantine_reason(duplicated, "list_dir")
    assert "pinned" not in quarantine_reason(duplicated, "list_dir")
    changed = await pinning.reconcile("fs", [{**read_file(), "description": POISONED}, list_dir()])
    assert changed.quarantined == {"read_file"}
    assert quarantine_reason(changed, "read_file") == "definition changed since it was pinned; awaiting approval"


async def test_a_pins_file_replaced_under_a_running_gateway_loses_no_pin(tmp_path: Path) -> None:
    pinning = make(tmp_path)
    await pinning.reconcile("files", [read_file(), list_dir()])
    assert (await pinning.reconcile("files", [read_file(POISONED), list_dir()])).quarantined == {"read_file"}
    (tmp_path / "pins.json").unlink()  # restored from an old backup, a volume re-created, ...
    with capture_logs() as logs:
        after = await pinning.reconcile("files", [read_file(POISONED), list_dir()])
    assert after.quarantined == {"read_file"}
    [lost] = [e for e in logs if e["event"] == "pin.store_lost"]
    assert (lost["log_level"], lost["restored"], lost["tools"]) == ("error", 2, ["list_dir", "read_file"])
    assert [p.pin.tool for p in await pinning.list("files")] == ["list_dir", "read_file"]
