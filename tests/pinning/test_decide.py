from __future__ import annotations

from dataclasses import replace

from bastion.pinning.decide import approve, decide, reject, unverified
from bastion.pinning.fingerprint import fingerprint, pinned_view
from bastion.pinning.model import BY_FIRST_USE, BY_TRUSTED_UPSTREAM, Pin
from tests.pinning.tools import POISONED, list_dir, read_file

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-02T00:00:00Z"


def pinned(*tools: dict[str, object]) -> dict[str, Pin]:
    return dict(decide({}, list(tools), upstream="files", trusted=False, now=T0).writes)


def test_new_tools_are_pinned_and_approved_on_first_use() -> None:
    r = decide({}, [read_file(), list_dir()], upstream="files", trusted=False, now=T0)
    assert r.decisions == {"read_file": "new", "list_dir": "new"}
    assert r.quarantined == frozenset()
    pin = r.writes["read_file"]
    assert pin == Pin(tool="read_file", fingerprint=fingerprint(read_file()), definition=pinned_view(read_file()),
                      status="approved", first_seen=T0, approved_by=BY_FIRST_USE, approved_at=T0)
    assert [(e.event, e.action, e.tool) for e in r.events] == [("pin.new", "pinned", "read_file"),
                                                             ("pin.new", "pinned", "list_dir")]


def test_unchanged_tools_write_nothing() -> None:
    r = decide(pinned(read_file()), [read_file()], upstream="files", trusted=False, now=T1)
    assert r.decisions == {"read_file": "unchanged"}
    assert (r.writes, r.events, r.quarantined) == ({}, (), frozenset())


def test_changed_tool_is_quarantined_keeping_the_approved_definition() -> None:
    pins = pinned(read_file())
    r = decide(pins, [read_file(POISONED)], upstream="files", trusted=False, now=T1)
    assert r.decisions == {"read_file": "changed"}
    assert r.quarantined == {"read_file"}
    pin = r.writes["read_file"]
    assert pin.status == "quarantined"
    assert pin.fingerprint == pins["read_file"].fingerprint
    assert pin.definition == pins["read_file"].definition
    assert pin.candidate is not None
    assert pin.candidate.fingerprint == fingerprint(read_file(POISONED))
    assert pin.candidate.first_seen == T1
    (event,) = r.events
    assert (event.event, event.action, event.old_fingerprint, event.new_fingerprint) == (
        "pin.drift", "quarantined", pins["read_file"].fingerprint, fingerprint(read_file(POISONED)))
    assert event.diff == (f'description: "Reads a file" -> "{POISONED}"',)


def test_same_candidate_seen_again_stays_quarantined_without_a_new_event() -> None:
    pins = dict(decide(pinned(read_file()), [read_file(POISONED)], upstream="files", trusted=False, now=T1).writes)
    r = decide(pins, [read_file(POISONED)], upstream="files", trusted=False, now=T1)
    assert (r.decisions, r.writes, r.events) == ({"read_file": "changed"}, {}, ())
    assert r.quarantined == {"read_file"}


def test_rejected_candidate_stays_quarantined_until_it_changes_again() -> None:
    pins = dict(decide(pinned(read_file()), [read_file(POISONED)], upstream="files", trusted=False, now=T1).writes)
    pins["read_file"] = reject(pins["read_file"], by="alice", now=T1)
    r = decide(pins, [read_file(POISONED)], upstream="files", trusted=False, now=T1)
    assert (r.writes, r.events, r.quarantined) == ({}, (), frozenset({"read_file"}))

    r = decide(pins, [read_file(POISONED + " v2")], upstream="files", trusted=False, now=T1)
    assert r.quarantined == {"read_file"}
    new_candidate = r.writes["read_file"].candidate
    assert new_candidate is not None
    assert new_candidate.rejected_by is None
    assert [e.event for e in r.events] == ["pin.drift"]


def test_going_back_to_the_approved_definition_restores_the_tool() -> None:
    pins = dict(decide(pinned(read_file()), [read_file(POISONED)], upstream="files", trusted=False, now=T1).writes)
    r = decide(pins, [read_file()], upstream="files", trusted=False, now=T1)
    assert r.decisions == {"read_file": "restored"}
    assert r.quarantined == frozenset()
    assert r.writes["read_file"] == pinned(read_file())["read_file"]
    assert [e.event for e in r.events] == ["pin.restored"]


def test_removed_tools_keep_their_pin() -> None:
    pins = pinned(read_file(), list_dir())
    r = decide(pins, [list_dir()], upstream="files", trusted=False, now=T1)
    assert r.decisions == {"list_dir": "unchanged", "read_file": "removed"}
    assert r.writes == {}
    # Re-adding it changed is drift, not a fresh first use.
    r = decide(pins, [list_dir(), read_file(POISONED)], upstream="files", trusted=False, now=T1)
    assert r.decisions["read_file"] == "changed"
    assert r.quarantined == {"read_file"}


def test_trusted_upstream_changes_are_approved_and_still_audited() -> None:
    pins = pinned(read_file())
    r = decide(pins, [read_file(POISONED)], upstream="files", trusted=True, now=T1)
    assert r.decisions == {"read_file": "changed"}
    assert r.quarantined == frozenset()
    pin = r.writes["read_file"]
    assert (pin.status, pin.fingerprint, pin.approved_by, pin.approved_at, pin.candidate) == (
        "approved", fingerprint(read_file(POISONED)), BY_TRUSTED_UPSTREAM, T1, None)
    assert pin.first_seen == T0
    (event,) = r.events
    assert (event.event, event.action) == ("pin.drift", "auto_approved")
    assert event.diff


def test_trusting_an_upstream_releases_its_quarantined_tools() -> None:
    pins = dict(decide(pinned(read_file()), [read_file(POISONED)], upstream="files", trusted=False, now=T1).writes)
    r = decide(pins, [read_file(POISONED)], upstream="files", trusted=True, now=T1)
    assert r.quarantined == frozenset()
    assert r.writes["read_file"].status == "approved"


def test_a_name_listed_twice_with_different_definitions_is_quarantined() -> None:
    r = decide({}, [read_file(), read_file(POISONED)], upstream="files", trusted=False, now=T0)
    assert r.decisions == {"read_file": "duplicate"}
    assert r.quarantined == {"read_file"}
    assert r.writes == {}
    same = decide({}, [read_file(), read_file()], upstream="files", trusted=False, now=T0)
    assert same.decisions == {"read_file": "new"}


def test_tools_without_a_name_are_ignored() -> None:
    r = decide({}, [{"description": "nameless"}, {"name": 3}], upstream="files", trusted=False, now=T0)
    assert (r.decisions, r.writes) == ({}, {})


def test_approve_makes_the_candidate_the_pin() -> None:
    pins = dict(decide(pinned(read_file()), [read_file(POISONED)], upstream="files", trusted=False, now=T1).writes)
    approved = approve(reject(pins["read_file"], by="bob", now=T1), by="alice", now=T1)
    assert (approved.status, approved.fingerprint, approved.approved_by, approved.candidate) == (
        "approved", fingerprint(read_file(POISONED)), "alice", None)
    r = decide({"read_file": approved}, [read_file(POISONED)], upstream="files", trusted=False, now=T1)
    assert r.decisions == {"read_file": "unchanged"}


def test_pins_round_trip_through_json() -> None:
    pins = dict(decide(pinned(read_file()), [read_file(POISONED)], upstream="files", trusted=False, now=T1).writes)
    pin = replace(pins["read_file"], candidate=reject(pins["read_file"], by="bob", now=T1).candidate)
    assert Pin.from_json("read_file", pin.to_json()) == pin


def test_unverified_keeps_only_tools_an_approved_pin_vouches_for() -> None:
    """Fail static: with the store unreachable, the last verified pins decide alone and nothing is written."""
    pins = pinned(read_file(), list_dir())
    assert unverified(pins, [read_file(), list_dir()]) == frozenset()
    assert unverified(pins, [read_file(POISONED), list_dir(), {"name": "grep"}]) == {"read_file", "grep"}
    assert unverified(pins, [read_file(), read_file(POISONED)]) == {"read_file"}  # listed twice, differently
    drifted = decide(pins, [read_file(POISONED)], upstream="files", trusted=False, now=T1).writes
    # A tool awaiting approval stays hidden even when the upstream lists the approved definition again: only
    # the store can record the restore.
    assert unverified({**pins, **drifted}, [read_file()]) == {"read_file"}
    assert unverified({}, [read_file()]) == {"read_file"}
