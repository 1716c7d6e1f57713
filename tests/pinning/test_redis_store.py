from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from bastion.pinning import (
    Pinning,
    PinningConfig,
    PinStoreUnavailable,
    RedisPinStore,
    fingerprint,
    open_store,
)
from tests.pinning.tools import POISONED, list_dir, read_file
from tests.support.redis_server import RedisServer


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[tuple[Pinning, Pinning, str]]:
    """Two gateways sharing one Redis, each with its own client, under a key prefix of this test's own."""
    prefix = f"test:{uuid.uuid4().hex}:pins:"
    clients = [aioredis.Redis.from_url(redis_server.url) for _ in range(2)]
    a, b = (Pinning(RedisPinStore(c, key_prefix=prefix), PinningConfig()) for c in clients)
    yield a, b, prefix
    for c in clients:
        await c.aclose()


async def test_pins_are_stored_as_one_hash_per_upstream(redis_server: RedisServer,
                                                       replicas: tuple[Pinning, Pinning, str]) -> None:
    a, _, prefix = replicas
    await a.reconcile("files", [read_file(), list_dir()])
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        raw = await client.hgetall(prefix + "files")
    finally:
        await client.aclose()
    assert set(raw) == {"read_file", "list_dir"}
    import json
    stored = json.loads(raw["read_file"])
    assert set(stored) == {"fingerprint", "definition", "status", "first_seen", "approved_by", "approved_at"}
    assert (stored["fingerprint"], stored["status"]) == (fingerprint(read_file()), "approved")


async def test_a_change_seen_by_one_replica_is_quarantined_for_both(
        replicas: tuple[Pinning, Pinning, str]) -> None:
    a, b, _ = replicas
    assert (await a.reconcile("files", [read_file()])).quarantined == frozenset()
    seen = await b.reconcile("files", [read_file(POISONED)])
    assert seen.quarantined == {"read_file"}
    assert [e.event for e in seen.events] == ["pin.drift"]
    other = await a.reconcile("files", [read_file(POISONED)])
    assert other.quarantined == {"read_file"}
    assert other.events == ()  # already audited by the replica that saw it first

    await b.approve("files", "read_file", "alice")
    assert (await a.reconcile("files", [read_file(POISONED)])).quarantined == frozenset()
    listed = await a.list()
    assert [(p.upstream, p.pin.tool, p.pin.status, p.pin.approved_by) for p in listed] == [
        ("files", "read_file", "approved", "alice")]


async def test_replicas_racing_on_one_change_audit_it_once(replicas: tuple[Pinning, Pinning, str]) -> None:
    a, b, _ = replicas
    await a.reconcile("files", [read_file(), list_dir()])
    outcomes = await asyncio.gather(*(r.reconcile("files", [read_file(POISONED), list_dir()])
                                      for _ in range(10) for r in (a, b)))
    assert all(o.quarantined == {"read_file"} for o in outcomes)
    assert sum(len(o.events) for o in outcomes) == 1


async def test_reject_on_one_replica_is_visible_to_the_other(replicas: tuple[Pinning, Pinning, str]) -> None:
    a, b, _ = replicas
    await a.reconcile("files", [read_file()])
    await a.reconcile("files", [read_file(POISONED)])
    await b.reject("files", "read_file", "bob")
    pin = await a.get("files", "read_file")
    assert pin.candidate is not None
    assert pin.candidate.rejected_by == "bob"
    assert await a.diff("files", "read_file") == [f'description: "Reads a file" -> "{POISONED}"']


async def test_redis_down_fails_static_and_recovers(private_redis: RedisServer) -> None:
    client = aioredis.Redis.from_url(private_redis.url)
    states: list[str] = []
    pinning = Pinning(open_store(PinningConfig(), client), PinningConfig(), on_store=states.append)
    try:
        await pinning.reconcile("files", [read_file(), list_dir()])
        private_redis.kill()
        # The last verified pins still vouch for unchanged tools: a healthy upstream stays callable.
        outcome = await pinning.reconcile("files", [read_file(), list_dir()])
        assert outcome.degraded
        assert outcome.quarantined == frozenset()
        assert outcome.events == ()
        # What they cannot vouch for (a changed definition, a new tool) is hidden until the store answers.
        changed = await pinning.reconcile("files", [read_file(POISONED), list_dir(), {"name": "new_tool"}])
        assert (changed.degraded, changed.quarantined) == (True, frozenset({"read_file", "new_tool"}))
        # An upstream whose pins were never read has nothing verified: all of it is hidden (fail closed).
        other = await pinning.reconcile("other", [read_file()])
        assert other.quarantined == {"read_file"}
        assert states == ["ok", "static", "static", "closed"]
        with pytest.raises(PinStoreUnavailable, match="redis error"):
            await pinning.approve("files", "read_file", "alice")
        with pytest.raises(PinStoreUnavailable):
            await pinning.list()
        private_redis.start()
        back = await pinning.reconcile("files", [read_file(), list_dir()])
        assert not back.degraded
        assert back.quarantined == frozenset()
    finally:
        await client.aclose()


async def test_a_redis_that_never_answers_fails_closed() -> None:
    # A listener that accepts connections but never replies: the store's own timeout has to end the wait.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        client = aioredis.Redis(host="127.0.0.1", port=port)
        pinning = Pinning(RedisPinStore(client, timeout_s=0.3), PinningConfig())
        try:
            outcome = await pinning.reconcile("files", [read_file()])
            assert (outcome.degraded, outcome.quarantined) == (True, frozenset({"read_file"}))
            with pytest.raises(PinStoreUnavailable, match="did not answer"):
                await pinning.list("files")
        finally:
            await client.aclose()



async def test_a_redis_restarted_empty_does_not_trust_a_quarantined_rug_pull_anew(
        private_redis: RedisServer) -> None:
    # Redis without persistence restarted (or flushed) under a running gateway: every pin was gone, so the next
    # refresh pinned the poisoned read_file as a trust-on-first-use "approved" tool, and clients could call it.
    client = aioredis.Redis.from_url(private_redis.url)
    pinning = Pinning(open_store(PinningConfig(), client), PinningConfig())
    try:
        await pinning.reconcile("files", [read_file(), list_dir()])
        assert (await pinning.reconcile("files", [read_file(POISONED), list_dir()])).quarantined == {"read_file"}
        private_redis.kill()
        private_redis.start()
        after = await pinning.reconcile("files", [read_file(POISONED), list_dir()])
        if after.degraded:  # the client's pooled connection died with the old server: failed static, once
            after = await pinning.reconcile("files", [read_file(POISONED), list_dir()])
        assert not after.degraded
        assert after.quarantined == {"read_file"}
        assert [e.event for e in after.events if e.event == "pin.new"] == []
        # Written back: the store holds the approved definition and the pending change again, for every replica.
        (pin,) = [p.pin for p in await pinning.list("files") if p.pin.tool == "read_file"]
        assert pin.fingerprint == fingerprint(read_file())
        assert pin.candidate is not None and pin.candidate.fingerprint == fingerprint(read_file(POISONED))
    finally:
        await client.aclose()
