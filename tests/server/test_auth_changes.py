"""A change of what the authenticator consults (a reloaded key table) wakes every waiting stream to check its
credential at once (``server/standing.py``: ``AuthChanges``, ``Standing.recheck``; ``server/stream_clock.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from bastion.backlog import Outbox
from bastion.errors import AuthenticationError
from bastion.principal import Principal
from bastion.server.standing import AuthChanges, Standing
from bastion.server.stream_clock import Idle, next_message

ALICE = Principal(id="alice", auth_method="api_key")


class Keys:
    """An authenticator over a set of valid keys that the test changes."""

    def __init__(self, *valid: str) -> None:
        self.valid = set(valid)
        self.asked = 0

    async def __call__(self, headers: Mapping[str, str]) -> Principal:
        self.asked += 1
        if headers.get("x-api-key") not in self.valid:
            raise AuthenticationError("Invalid credentials", challenge="Bearer", log_detail="unknown API key")
        return ALICE


def standing(keys: Keys, changes: AuthChanges, checked: int | None = None) -> Standing:
    return Standing(ALICE, {"x-api-key": "k1"}, keys, changes=changes, checked=checked)


async def test_a_change_wakes_a_waiting_stream_at_once_and_its_check_sees_it() -> None:
    keys, changes = Keys("k1"), AuthChanges()
    held = standing(keys, changes)
    queue: Outbox = Outbox()
    waiting = asyncio.ensure_future(next_message(queue.get, 3600, None, held.recheck))
    await asyncio.sleep(0)
    assert not waiting.done()
    keys.valid.clear()
    changes.advance()
    assert await asyncio.wait_for(waiting, 5) is Idle.TICK
    assert (await held.check()).ended == "revoked"


async def test_a_change_made_before_the_stream_waits_is_not_missed() -> None:
    """Between the request's authentication (the count it was taken under) and the stream's first wait, or while
    a check runs: the next wait returns at once."""
    keys, changes = Keys("k1"), AuthChanges()
    authenticated_under = changes.number
    changes.advance()
    held = standing(keys, changes, checked=authenticated_under)
    assert await asyncio.wait_for(next_message(Outbox().get, 3600, None, held.recheck), 5) is Idle.TICK
    assert (await held.check()).ended is None
    # Checked under the count in force now: the next wait waits again.
    waiting = asyncio.ensure_future(next_message(Outbox().get, 0.05, None, held.recheck))
    assert await waiting is Idle.TICK  # its tick, not a change
    assert keys.asked == 1


async def test_a_message_taken_as_a_change_comes_is_delivered_and_none_is_lost() -> None:
    changes = AuthChanges()
    held = standing(Keys("k1"), changes)
    queue: Outbox = Outbox()
    queue.put_nowait({"n": 1})
    changes.advance()
    got: list[Any] = []
    for _ in range(3):
        item = await asyncio.wait_for(next_message(queue.get, 3600, None, held.recheck), 5)
        got.append(item)
        if item is Idle.TICK:
            await held.check()
            queue.put_nowait({"n": 2})
    # The queued message first or the check first, but both messages, in order, and one check.
    messages = [m for m in got if m is not Idle.TICK]
    assert messages == [{"n": 1}, {"n": 2}] and got.count(Idle.TICK) == 1


async def test_a_wait_cancelled_from_outside_leaves_the_queue_as_it_was() -> None:
    held = standing(Keys("k1"), AuthChanges())
    queue: asyncio.Queue[dict[str, int]] = asyncio.Queue()
    waiting = asyncio.ensure_future(next_message(queue.get, 3600, None, held.recheck))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    queue.put_nowait({"n": 1})
    assert await asyncio.wait_for(next_message(queue.get, 3600, None, held.recheck), 5) == {"n": 1}


def test_without_changes_to_count_there_is_nothing_to_wait_for() -> None:
    assert Standing(ALICE, {}, Keys()).recheck is None
    assert Standing(ALICE, {}, None, changes=AuthChanges()).recheck is None
