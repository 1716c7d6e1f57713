"""Which sessions get an upstream's log message sent outside any call: pure decisions, no I/O."""

from __future__ import annotations

from typing import Any

from bastion.backlog import Outbox
from bastion.principal import Principal
from bastion.server.log_relay import MAX_BACKLOG, level_allows, log_targets, stamped
from bastion.sessions.live import LiveSession

ALICE = Principal("alice", frozenset({"eng"}))
BOB = Principal("bob", frozenset({"ops"}))


def live(sid: str, *, principal: Principal | None = ALICE, level: str | None = "info",
         stream: bool = True) -> LiveSession:
    session = LiveSession(sid)
    session.principal = principal
    session.log_level = level
    session.get_stream = Outbox(bound=MAX_BACKLOG, queue="session") if stream else None
    return session


def test_levels_follow_rfc5424_order_and_no_floor_means_did_not_ask() -> None:
    assert level_allows("warning", "error") and level_allows("warning", "warning")
    assert not level_allows("warning", "info")
    assert not level_allows(None, "emergency")
    assert not level_allows("info", "loud")  # an upstream's made-up level passes no floor
    assert not level_allows("bogus", "error")


async def test_only_sessions_that_asked_and_may_see_get_it() -> None:
    sessions = [live("asked"), live("no-floor", level=None), live("too-high", level="error"),
                live("no-stream", stream=False), live("bob", principal=BOB), live("anonymous", principal=None)]
    targets = log_targets(sessions, "warning", lambda p: p.id == "alice")
    assert [s.id for s in targets] == ["asked"]


async def test_a_full_stream_drops_log_messages_counts_them_and_says_so_once() -> None:
    dropped: list[tuple[str, str]] = []
    stream = Outbox(lambda queue, kind: dropped.append((queue, kind)), bound=MAX_BACKLOG, queue="session")
    message = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
    for _ in range(MAX_BACKLOG + 1000):
        stream.offer(message)
    assert len(stream) == MAX_BACKLOG + 1  # the bound, and one marker for the gap
    assert dropped == [("session", "log")] * 1000
    got = [await stream.get() for _ in range(MAX_BACKLOG + 1)]
    marker = got[-1]
    assert marker is not None and marker["params"]["logger"] == "bastion"
    assert marker["params"]["data"]["dropped"] == {"log": 1000}


def test_a_message_outside_a_call_names_its_upstream_unless_it_has_a_logger() -> None:
    params: dict[str, Any] = {"level": "info", "data": "x"}
    assert stamped("files", params) == {"level": "info", "data": "x", "logger": "files"}
    assert stamped("files", {**params, "logger": "db"})["logger"] == "db"
    assert "logger" not in params  # the upstream's params are not modified
