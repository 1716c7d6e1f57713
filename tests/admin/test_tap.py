"""The audit ring buffer and the audit log's in-process listeners."""

from __future__ import annotations

import asyncio
from typing import Any

from bastion.admin.pages import matches, side_by_side
from bastion.admin.session import Signer
from bastion.admin.tap import AuditTap
from bastion.audit.log import AuditLog


class ListSink:
    name = "list"

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    async def close(self) -> None:
        return None


async def test_listeners_see_every_record_and_a_failing_one_fails_nothing() -> None:
    sink = ListSink()
    log = AuditLog([sink], required=True)
    seen: list[dict[str, Any]] = []

    def broken(record: dict[str, Any]) -> None:
        raise RuntimeError("listener bug")

    log.listeners += [broken, seen.append]
    await log.emit({"event": "x"})
    assert seen == [{"event": "x"}] and sink.records == [{"event": "x"}]
    empty = AuditLog([])
    empty.listeners.append(seen.append)
    await empty.emit({"event": "y"})  # no sinks: the console still sees it
    assert seen[-1] == {"event": "y"}


async def test_tap_is_bounded_resumable_and_wakes_waiters() -> None:
    now = [1000.0]
    tap = AuditTap(3, clock=lambda: now[0])
    for i in range(5):
        tap({"event": "tool.call", "decision": "deny" if i % 2 else "allow", "i": i})
    assert [r["i"] for _, r in tap.since(0)] == [2, 3, 4]
    assert [r["i"] for _, r in tap.since(4)] == [4]
    assert tap.per_minute() == {"calls": 3, "allow": 2, "deny": 1}
    now[0] += 61
    assert tap.per_minute() == {"calls": 0}
    assert await tap.wait(tap.last, 0.01) == []
    waiter = asyncio.create_task(tap.wait(tap.last, 5))
    await asyncio.sleep(0)
    tap({"event": "session.start"})
    assert [r["event"] for _, r in await waiter] == ["session.start"]


def test_signed_values_resist_tampering_and_expire() -> None:
    signer = Signer(b"k" * 32)
    cookie, session = signer.issue("root", ("admin",), "api_key", now=100.0, ttl_s=10)
    assert signer.session(cookie, now=105.0) == session
    assert signer.session(cookie, now=111.0) is None
    assert Signer(b"j" * 32).session(cookie, now=105.0) is None
    body, _, mac = cookie.partition(".")
    assert signer.session(body[:-2] + "xx." + mac, now=105.0) is None
    assert signer.session("garbage", now=105.0) is None
    nonce, token = signer.login_token()
    assert signer.login_ok(nonce, token)
    assert not signer.login_ok(nonce + "x", token) and not signer.login_ok(nonce, None)


def test_filters_and_side_by_side() -> None:
    record = {"event": "tool.call", "principal": {"id": "alice"}, "tool": {"name": "basic__add"},
              "decision": "deny", "rule_id": "no-add"}
    assert matches(record, {"principal": "ali", "decision": "deny", "rule": "", "tool": "add"})
    assert not matches(record, {"decision": "allow"})
    rows = side_by_side(["a", "b", "c"], ["a", "B", "c", "d"])
    assert rows == [("same", "a", "a"), ("chg", "b", "B"), ("same", "c", "c"), ("add", "", "d")]
