"""The upstream pool: connects every configured upstream, fetches their lists, and keeps them fresh.

One upstream failing never stops the others: at start-up the gateway serves the catalogue of the upstreams that
answered, logs the failure, and keeps retrying the missing ones in the background with backoff. When any
upstream announces ``notifications/*/list_changed`` (or comes back after a restart), its lists are fetched again,
debounced, and the ``on_change`` callback receives the full set so the caller can rebuild its catalogue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from bastion.catalogue import UpstreamLists
from bastion.errors import RequestError
from bastion.upstream.base import Upstream

log = structlog.get_logger("bastion.pool")

ChangeHandler = Callable[[Mapping[str, UpstreamLists]], Awaitable[None]]
# Any other notification an upstream sends outside a request (resources/updated, ...): (upstream, method, params).
EventHandler = Callable[[str, str, Mapping[str, Any]], Awaitable[None]]

_LIST_METHODS = (("tools", "tools/list", "tools"), ("prompts", "prompts/list", "prompts"),
                 ("resources", "resources/list", "resources"),
                 ("templates", "resources/templates/list", "resourceTemplates"))
_CAPABILITY = {"tools": "tools", "prompts": "prompts", "resources": "resources", "templates": "resources"}
_MAX_PAGES = 1000


@dataclass(frozen=True, slots=True)
class Member:
    upstream: Upstream
    prefix: str | None
    timeout_s: float


class UpstreamPool:
    def __init__(self, members: Sequence[Member], on_change: ChangeHandler, *, debounce_s: float = 0.2,
                 retry_max_s: float = 30.0, refresh_interval_s: float | None = None,
                 on_event: EventHandler | None = None) -> None:
        self._members = {m.upstream.name: m for m in members}
        self._order = [m.upstream.name for m in members]
        self._on_change = on_change
        self._debounce_s = debounce_s
        self._retry_max_s = retry_max_s
        self._interval = refresh_interval_s
        self._on_event = on_event
        self._lists: dict[str, UpstreamLists] = {}
        self._up: dict[str, bool] = dict.fromkeys(self._order, False)
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def names(self) -> list[str]:
        return list(self._order)

    def member(self, name: str) -> Member:
        return self._members[name]

    def is_up(self, name: str) -> bool:
        return self._up.get(name, False)

    def health(self) -> dict[str, bool]:
        return dict(self._up)

    async def start(self) -> None:
        """Connect every upstream concurrently; publish the first catalogue; start the refresher."""
        await asyncio.gather(*(self._connect(name) for name in self._order))
        await self._publish()
        self._tasks.append(asyncio.create_task(self._refresher(), name="bastion-pool-refresher"))
        for name in self._order:
            if not self._up[name]:
                self._tasks.append(asyncio.create_task(self._retry(name), name=f"bastion-retry-{name}"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*(m.upstream.close() for m in self._members.values()), return_exceptions=True)

    async def _connect(self, name: str) -> bool:
        member = self._members[name]

        async def on_notification(method: str, params: Mapping[str, Any]) -> None:
            if method.endswith("/list_changed"):
                self.mark_dirty(name)
            elif self._on_event is not None:
                await self._on_event(name, method, params)

        try:
            await member.upstream.start(on_notification)
            lists = await self._fetch(member)
        except RequestError as exc:
            log.warning("upstream.unavailable", upstream=name, error=exc.message, detail=exc.log_detail)
            self._up[name] = False
            # A half-started upstream (a spawned child that never answered, a listener task) must not outlive
            # this attempt: the next retry starts from scratch, so nothing accumulates.
            with contextlib.suppress(Exception):
                await member.upstream.close()
            return False
        self._lists[name] = lists
        self._up[name] = True
        log.info("upstream.connected", upstream=name, tools=len(lists.tools), prompts=len(lists.prompts),
                 resources=len(lists.resources))
        return True

    async def _retry(self, name: str) -> None:
        delay = 0.5
        while not self._up[name]:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._retry_max_s)
            if await self._connect(name):
                # _connect fetched its lists already; only the catalogue needs republishing.
                self._wake.set()

    def mark_dirty(self, name: str) -> None:
        self._dirty.add(name)
        self._wake.set()

    async def _refresher(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._interval)
            except TimeoutError:
                # Periodic refresh: catches silent definition changes (no list_changed) and applies pin approvals
                # made on another replica or from the CLI.
                self._dirty.update(name for name in self._order if self._up[name])
            # Debounce: a burst of list_changed notifications (an upstream adding ten tools) costs one refresh.
            await asyncio.sleep(self._debounce_s)
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            for item in sorted(dirty):
                member = self._members.get(item)
                if member is None:
                    continue
                try:
                    self._lists[item] = await self._fetch(member)
                    self._up[item] = True
                except RequestError as exc:
                    log.warning("upstream.refresh_failed", upstream=item, error=exc.message, detail=exc.log_detail)
            await self._publish()

    async def refresh_now(self) -> None:
        """Re-fetch every live upstream and publish (used by tests and the admin CLI)."""
        for name in self._order:
            if self._up[name]:
                with contextlib.suppress(RequestError):
                    self._lists[name] = await self._fetch(self._members[name])
        await self._publish()

    async def _publish(self) -> None:
        ordered = {name: self._lists[name] for name in self._order if name in self._lists}
        try:
            await self._on_change(ordered)
        except Exception:
            log.exception("catalogue.rebuild_failed")

    async def _fetch(self, member: Member) -> UpstreamLists:
        info = member.upstream.info
        caps = info.capabilities if info is not None else {}
        found: dict[str, list[Mapping[str, Any]]] = {}
        for attr, method, key in _LIST_METHODS:
            if _CAPABILITY[attr] not in caps:
                found[attr] = []
                continue
            found[attr] = await self._paginate(member, method, key)
        return UpstreamLists(name=member.upstream.name, prefix=member.prefix, tools=found["tools"],
                             prompts=found["prompts"], resources=found["resources"], templates=found["templates"])

    async def _paginate(self, member: Member, method: str, key: str) -> list[Mapping[str, Any]]:
        items: list[Mapping[str, Any]] = []
        cursor: Any = None
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            params = {"cursor": cursor} if cursor is not None else None
            result = await member.upstream.request(method, params, timeout=member.timeout_s)
            page = result.get(key)
            if isinstance(page, list):
                items.extend(item for item in page if isinstance(item, Mapping))
            cursor = result.get("nextCursor")
            # A hostile or buggy upstream that repeats a cursor must not loop the gateway forever.
            if cursor is None or not isinstance(cursor, str) or cursor in seen:
                break
            seen.add(cursor)
        return items
