"""Hear about pin decisions made outside this gateway, so an approval takes effect within a second.

``bastion pins approve`` writes the store; a running gateway would otherwise apply it only at its next periodic
refresh. The watcher calls ``on_change`` (the pool's ``republish_soon``: rebuild the view from the lists already
fetched, so pinning re-reads the store) as soon as a change is seen:

- file store: the file's identity (mtime, size, inode) is polled every ``interval`` seconds. Polling rather than
  inotify, like the policy watcher: it behaves the same everywhere, including a file replaced by rename. The
  gateway's own reconcile writes are skipped when the store vouches that nothing else wrote the file in between
  (``FilePinStore.wrote``): at a first start every upstream's new pins are one write each, and each would otherwise
  cost a full rebuild that reads nothing new.
- Redis store: admin decisions are published on the store's channel (``RedisPinStore.announce``); the watcher
  subscribes. Redis does not keep messages for a disconnected subscriber, so after a reconnect the watcher calls
  ``on_change`` once anyway, in case it missed one.

Only admin decisions are announced on Redis, never a replica's own reconcile writes: replicas that momentarily see
different listings of one upstream would otherwise trigger each other's rebuilds in a loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
import structlog

from bastion.pinning.store import FileIdentity, FilePinStore, PinStore, RedisPinStore, file_identity
from bastion.redisconn import open_pubsub

log = structlog.get_logger("bastion.pinning")

class PinWatcher(Protocol):
    async def run(self) -> None: ...


class FilePinWatcher:
    """``own`` says whether a file identity is this gateway's own write of nothing new (``FilePinStore.wrote``)."""

    def __init__(self, path: Path, on_change: Callable[[], None], *, interval: float = 0.25,
                 own: Callable[[FileIdentity | None], bool] | None = None) -> None:
        self._path = path
        self._on_change = on_change
        self._interval = interval
        self._own = own

    async def run(self) -> None:
        seen = file_identity(self._path)
        while True:
            await asyncio.sleep(self._interval)
            now = file_identity(self._path)
            if now != seen:
                seen = now
                if self._own is not None and self._own(now):
                    continue
                log.info("pin.store_changed", store="file", path=str(self._path))
                self._on_change()


class RedisPinWatcher:
    def __init__(self, client: aioredis.Redis, channel: str, on_change: Callable[[], None], *,
                 retry_s: float = 1.0) -> None:
        self._client = client
        self._channel = channel
        self._on_change = on_change
        self._retry_s = retry_s

    async def run(self) -> None:
        subscribed_before = False
        while True:
            try:
                async with await open_pubsub(self._client) as pubsub:
                    await pubsub.subscribe(self._channel)
                    if subscribed_before:
                        self._on_change()  # a decision may have been announced while we were not listening
                    subscribed_before = True
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if message is not None and message.get("type") == "message":
                            upstream = message.get("data")
                            log.info("pin.store_changed", store="redis",
                                     upstream=upstream.decode("utf-8", "replace")
                                     if isinstance(upstream, bytes) else upstream)
                            self._on_change()
            except asyncio.CancelledError:
                raise
            except (redis_errors.RedisError, OSError) as exc:
                log.warning("pin.watch_failed", store="redis", error=type(exc).__name__)
                await asyncio.sleep(self._retry_s)


def watch_store(store: PinStore, on_change: Callable[[], None]) -> PinWatcher | None:
    """The watcher for ``store``'s kind (None for a store nobody else writes)."""
    if isinstance(store, FilePinStore):
        return FilePinWatcher(store.path, on_change, own=store.wrote)
    if isinstance(store, RedisPinStore):
        return RedisPinWatcher(store.client, store.channel, on_change)
    return None
