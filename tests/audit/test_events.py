"""``AuditEvents``, the one way non-call records are written: each record valid against the schema, stamped by
the injected clock, and the records scheduled from synchronous code written before ``flush`` returns."""

from __future__ import annotations

from typing import Any

from bastion.audit import AuditEvents
from bastion.audit.events import auth_failure_reason
from bastion.catalogue_limits import LimitDrop
from bastion.principal import Principal
from tests.audit.helpers import assert_valid

T0 = 1_700_000_000.0


class Sink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def __call__(self, record: dict[str, Any]) -> None:
        assert_valid(record)
        self.records.append(record)


async def test_session_records_carry_their_duration_only_when_the_start_is_known() -> None:
    sink, now = Sink(), [T0]
    events = AuditEvents(sink, clock=lambda: now[0])
    alice = Principal(id="alice")
    await events.session_started("s1", era="legacy", principal=alice, client_info={"name": "c"},
                                 protocol_version="2025-11-25")
    now[0] = T0 + 2.5
    await events.session_ended("s1", era="legacy", principal=alice, client_info={}, protocol_version=None,
                               reason="deleted")
    await events.session_ended("s2", era="legacy", principal=None, client_info={}, protocol_version=None,
                               reason="expired", created_at=T0)
    start, deleted, expired = sink.records
    assert (start["event"], start["reason"], start["principal"]["id"]) == ("session.start", None, "alice")
    assert (deleted["event"], deleted["reason"], deleted["duration_ms"]) == ("session.end", "deleted", None)
    assert (expired["reason"], expired["duration_ms"]) == ("expired", 2500.0)


async def test_records_scheduled_from_synchronous_code_are_written_by_flush() -> None:
    sink = Sink()
    events = AuditEvents(sink, clock=lambda: T0)
    events.policy_reloaded_soon("rejected", source="p.yaml", digest="abc", error="bad rule")
    events.session_ended_soon("s3", era="legacy", principal=None, client_info={}, protocol_version=None,
                              reason="expired")
    assert sink.records == []  # scheduled, not yet run
    await events.flush()
    assert [(r["event"], r.get("outcome") or r.get("reason")) for r in sink.records] == [
        ("policy.reload", "rejected"), ("session.end", "expired")]


async def test_catalogue_and_auth_records() -> None:
    sink = Sink()
    events = AuditEvents(sink, clock=lambda: T0)
    await events.catalogue_limit(LimitDrop("up", "tools", "max_tools", 2, 3, ("a", "b", "c")))
    await events.catalogue_drop(upstream="up", item_kind="tool", item="x", reason="schema rejected",
                                action="quarantined")
    await events.pin_drift(upstream="up", tool="x", pinned="f1", observed="f2", action="blocked")
    await events.auth_failed("token expired", method="bearer", remote_addr="192.0.2.1", traceparent=None)
    assert [r["event"] for r in sink.records] == ["catalogue.limit", "catalogue.drop", "pin.drift", "auth.failure"]
    assert sink.records[-1]["reason"] == "expired"


def test_auth_failure_classes_come_from_the_authenticators_reason() -> None:
    assert auth_failure_reason(None) == "other"
    assert auth_failure_reason("Missing bearer token") == "missing_credentials"
    assert auth_failure_reason("token not yet valid") == "not_yet_valid"
    assert auth_failure_reason("JWKS fetch failed") == "jwks_unavailable"
    assert auth_failure_reason("something else") == "other"
