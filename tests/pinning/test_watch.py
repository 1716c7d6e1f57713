"""Pin decisions reach running gateways at once: the file watch and the Redis announcement, with real stores."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

from bastion.pinning.model import Pin
from bastion.pinning.store import FilePinStore, RedisPinStore
from bastion.pinning.watch import FilePinWatcher, RedisPinWatcher, watch_store
from tests.support.redis_server import RedisServer


@dataclass(frozen=True)
class Put:
    writes: Mapping[str, Pin]


def pin(tool: str, approved_by: str = "trust-on-first-use") -> Pin:
    return Pin(tool=tool, fingerprint="sha256:" + tool, definition={"name": tool}, status="approved",
               first_seen="t", approved_by=approved_by, approved_at="t")


async def wait_for(condition: asyncio.Event, timeout: float = 5.0) -> bool:
    try:
        async with asyncio.timeout(timeout):
            await condition.wait()
        return True
    except TimeoutError:
        return False


async def test_the_file_watch_sees_a_rewrite_of_the_pin_file(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    path.write_text('{"version": 1, "upstreams": {}}\n')
    changed = asyncio.Event()
    watcher = FilePinWatcher(path, changed.set, interval=0.05)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.sleep(0.2)
        assert not changed.is_set()  # nothing changed, nothing reported
        tmp = tmp_path / "pins.json.new"
        tmp.write_text('{"version": 1, "upstreams": {"a": {}}}\n')
        tmp.replace(path)  # how the store writes: rename over the old file
        assert await wait_for(changed)
    finally:
        task.cancel()


async def test_the_file_watch_skips_the_gateways_own_writes_but_not_a_write_between_them(tmp_path: Path) -> None:
    # At a first start the gateway pins every upstream's tools, one write per upstream: rebuilding the catalogue
    # for each would read nothing new. A write by another process (the admin CLI) between two of them must still
    # be seen, whether the watcher polls before or after the gateway's next write.
    path = tmp_path / "pins.json"
    gateway, admin = FilePinStore(path), FilePinStore(path)
    calls = 0
    changed = asyncio.Event()

    def on_change() -> None:
        nonlocal calls
        calls += 1
        changed.set()

    watcher = watch_store(gateway, on_change)
    assert isinstance(watcher, FilePinWatcher)
    task = asyncio.create_task(watcher.run())
    try:
        for upstream in ("u1", "u2", "u3"):
            await gateway.update(upstream, lambda pins: Put({"t": pin("t")}))
            await asyncio.sleep(0.3)  # the watcher (every 0.25 s) sees each write
        assert calls == 0
        await admin.update("u1", lambda pins: Put({"t": pin("t", approved_by="alice")}))
        await gateway.update("u4", lambda pins: Put({"t": pin("t")}))  # before the watcher polls again
        assert await wait_for(changed)
        assert calls == 1
        # Back to the gateway's own writes after it read the admin's change: quiet again.
        changed.clear()
        await gateway.update("u5", lambda pins: Put({"t": pin("t")}))
        await asyncio.sleep(0.6)
        assert calls == 1
    finally:
        task.cancel()


async def test_an_announcement_reaches_a_subscriber_and_idling_costs_nothing(redis_server: RedisServer) -> None:
    # The gateway's client has 1 s socket timeouts; an idle subscription must not turn them into reconnects.
    gateway_client = aioredis.Redis.from_url(redis_server.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    admin = RedisPinStore(aioredis.Redis.from_url(redis_server.url), key_prefix="watch-test:", owns_client=True)
    store = RedisPinStore(gateway_client, key_prefix="watch-test:")
    calls = 0
    changed = asyncio.Event()

    def on_change() -> None:
        nonlocal calls
        calls += 1
        changed.set()

    watcher = watch_store(store, on_change)
    assert isinstance(watcher, RedisPinWatcher)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.sleep(2.5)  # idle past the socket timeout twice
        assert calls == 0
        await admin.announce("github")
        assert await wait_for(changed)
        assert calls == 1
    finally:
        task.cancel()
        await admin.close()
        await gateway_client.aclose()


def test_each_store_gets_its_watcher(tmp_path: Path) -> None:
    assert isinstance(watch_store(FilePinStore(tmp_path / "p.json"), lambda: None), FilePinWatcher)
