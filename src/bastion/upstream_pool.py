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
from typing import Any, Literal

import structlog

from bastion.catalogue import UpstreamLists
from bastion.catalogue_limits import CatalogueLimits, LimitDrop, ListBudget, ListKind
from bastion.errors import RequestError, UpstreamRpcError
from bastion.health import HealthConfig, HealthMonitor
from bastion.health import machine as health_machine
from bastion.health.machine import Health
from bastion.health.monitor import Transition
from bastion.refresh_gate import RefreshRequests
from bastion.stopping import cancel_and_wait
from bastion.upstream.base import Upstream

log = structlog.get_logger("bastion.pool")

ChangeHandler = Callable[[Mapping[str, UpstreamLists]], Awaitable[None]]
# Any other notification an upstream sends outside a request (resources/updated, ...): (upstream, method, params).
EventHandler = Callable[[str, str, Mapping[str, Any]], Awaitable[None]]
# Items a list fetch dropped under ``catalogue.limits`` (the app writes them to the audit log).
LimitHandler = Callable[[LimitDrop], Awaitable[None]]
# One fetch of an upstream's lists: ok, error (it answered with a JSON-RPC error), failed (no usable answer).
RefreshOutcome = Literal["ok", "error", "failed"]

_LIST_METHODS = (("tools", "tools/list", "tools"), ("prompts", "prompts/list", "prompts"),
                 ("resources", "resources/list", "resources"),
                 ("templates", "resources/templates/list", "resourceTemplates"))
_CAPABILITY = {"tools": "tools", "prompts": "prompts", "resources": "resources", "templates": "resources"}
# A gated upstream whose refresh failed is tried again this soon (its tools stay gated meanwhile), then less and
# less often (up to ``retry_max_s``) while it keeps failing: its health, not this retry, notices its return.
_GATED_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Member:
    upstream: Upstream
    prefix: str | None
    timeout_s: float


class UpstreamPool:
    def __init__(self, members: Sequence[Member], on_change: ChangeHandler, *, debounce_s: float = 0.2,
                 retry_max_s: float = 30.0, refresh_interval_s: float | None = None,
                 on_event: EventHandler | None = None, limits: CatalogueLimits | None = None,
                 on_limit: LimitHandler | None = None, health: HealthConfig | None = None,
                 on_health: Transition | None = None,
                 on_hidden: Callable[[frozenset[str]], Awaitable[None]] | None = None,
                 on_refresh: Callable[[str, RefreshOutcome], None] | None = None,
                 requests: RefreshRequests | None = None) -> None:
        self._members = {m.upstream.name: m for m in members}
        self._order = [m.upstream.name for m in members]
        self._on_change = on_change
        self._debounce_s = debounce_s
        self._retry_max_s = retry_max_s
        self._interval = refresh_interval_s
        self._on_event = on_event
        self._lists: dict[str, UpstreamLists] = {}
        self._up: dict[str, bool] = dict.fromkeys(self._order, False)
        # What to fetch again, asked for by the pool itself and by others (pin re-checks, approvals).
        self._requests = requests or RefreshRequests()
        self._tasks: list[asyncio.Task[None]] = []
        self._limits = limits or CatalogueLimits()
        self._on_limit = on_limit
        self._on_refresh = on_refresh
        # Refresh gating (see refresh_gate): the gate generation each stored list was fetched at, and the lists
        # the current view was built from, to tell a changed listing from a routine refresh.
        self.gate = self._requests.gate
        self._fetched_at: dict[str, int] = {}
        self._published: dict[str, UpstreamLists] = {}
        # The next retry delay of each gated upstream whose refresh keeps failing, and whether the last publish
        # failed (the next round must publish even if it fetched nothing new).
        self._gated_retry: dict[str, float] = {}
        self._publish_failed = False
        self._limit_seen: dict[str, frozenset[tuple[str, str, int]]] = {}
        # Health is tracked apart from "connected" (``_up``): a connected upstream can die later, and its state
        # (up, degraded, down, restarting) drives readiness, metrics (``on_health``), fail-fast calls and hidden
        # tools (``on_hidden``). The pool probes for it and refreshes the lists of an upstream that recovered.
        # The refresh gate hears of it too: it never holds calls for an upstream that cannot answer them.
        self._on_health = on_health
        self.monitor = HealthMonitor(self._order, health or HealthConfig(), probe=self._probe,
                                     on_recovered=self._recovered, on_transition=self._health_changed,
                                     on_hidden=on_hidden)
        for name in self._order:
            self.gate.unreachable(name, f"upstream is down: {self.monitor.status(name).reason}")

    @property
    def names(self) -> list[str]:
        return list(self._order)

    def member(self, name: str) -> Member:
        return self._members[name]

    def is_up(self, name: str) -> bool:
        return self._up.get(name, False) and self.monitor.status(name).answering

    def health(self) -> dict[str, bool]:
        return {name: self.is_up(name) for name in self._order}

    async def _probe(self, name: str, timeout: float) -> bool:
        """One active health probe: ``ping`` in the handshake era, ``server/discover`` in 2026-07-28 (which has
        no ping). An upstream never connected is left to the connect retry."""
        if not self._up.get(name):
            return False
        upstream = self._members[name].upstream
        info = upstream.info
        await upstream.request("server/discover" if info is not None and info.era == "modern" else "ping", None,
                               timeout=timeout)
        return True

    def _recovered(self, name: str) -> None:
        # Back after an outage of a connected upstream (probe answered, child restarted): it may have come back
        # with other tools, so its lists are fetched again.
        if self._up.get(name):
            self.mark_dirty(name)

    def _health_changed(self, name: str, old: Health, new: Health) -> None:
        if health_machine.refuses_calls(new):
            # Calls to it fail fast; a closed refresh gate must not make them wait for a refresh that cannot work.
            self.gate.unreachable(name, f"upstream is down: {new.reason}")
        elif new.state == "up":
            self.gate.reachable(name)
            if self.gate.is_closed(name):
                # Its gated refresh may be backing off: try now, its tools wait for it again.
                self._gated_retry.pop(name, None)
                self._requests.mark_dirty(name, gate=False)
        if self._on_health is not None:
            self._on_health(name, old, new)
        # Last: the restart reports ``restarting`` at once, a transition of its own that must come after this one
        # in the metrics and the gate, or they would end on ``down``.
        if new.state == "down" and old.state != "down" and self._up.get(name):
            self._restart_unresponsive(name, new.reason)

    def _restart_unresponsive(self, name: str, reason: str) -> None:
        """A connected upstream is ``down``: its calls and probes fail although its transport holds it connected.
        The transport replaces what it holds (``Upstream.restart``: a stdio child, an HTTP+SSE stream, a Streamable
        HTTP session), since nothing else would: it hears only of a connection that ends, and a hung child keeps
        its pipes open as a frozen server keeps its TCP connections. A supervised transport's health then goes
        ``restarting``, and back ``up`` once the new connection answered, its backoff pacing a server that hangs
        again each time; a Streamable HTTP upstream is ``up`` once its new session answered, and stays ``down``
        (calls failing fast) while there is none."""
        if self._members[name].upstream.restart(f"health down: {reason}"):
            self.monitor.restarted(name)

    def _watch_transport(self, name: str) -> None:
        watch = getattr(self._members[name].upstream, "watch", None)
        if not callable(watch):
            return

        def on_state(event: str, detail: str) -> None:
            if event == "restarting":
                self.monitor.restarting(name, detail)
            elif event == "connected":
                self.monitor.connected(name)
            elif event == "suspect":
                self.monitor.suspect(name, detail)

        watch(on_state)

    async def start(self) -> None:
        """Connect every upstream concurrently; publish the first catalogue; start the refresher."""
        for name in self._order:
            self._watch_transport(name)
        await asyncio.gather(*(self._connect(name) for name in self._order))
        await self._publish()
        self.monitor.start()
        self._tasks.append(asyncio.create_task(self._refresher(), name="bastion-pool-refresher"))
        for name in self._order:
            if not self._up[name]:
                self._tasks.append(asyncio.create_task(self._retry(name), name=f"bastion-retry-{name}"))

    async def close(self) -> None:
        await self.monitor.close()
        await cancel_and_wait(self._tasks)
        await asyncio.gather(*(m.upstream.close() for m in self._members.values()), return_exceptions=True)

    async def _connect(self, name: str) -> bool:
        member = self._members[name]

        async def on_notification(method: str, params: Mapping[str, Any]) -> None:
            if method.endswith("/list_changed"):
                # Only a tools announcement gates calls: prompts and resources are not called through tools/call.
                self.mark_dirty(name, gate=method == "notifications/tools/list_changed")
            elif self._on_event is not None:
                await self._on_event(name, method, params)

        try:
            await member.upstream.start(on_notification)
            await self._load(name)
        except RequestError as exc:
            log.warning("upstream.unavailable", upstream=name, error=exc.message, detail=exc.log_detail)
            self._up[name] = False
            self.monitor.disconnected(name, exc.log_detail or exc.message)
            # A half-started upstream (a spawned child that never answered, a listener task) must not outlive
            # this attempt: the next retry starts the same object from scratch (``Upstream``'s restart contract), so
            # nothing accumulates.
            with contextlib.suppress(Exception):
                await member.upstream.close()
            return False
        lists = self._lists[name]
        # Before _up: lists were just fetched, so this recovery needs no refresh (see _recovered).
        self.monitor.connected(name)
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
                self._requests.republish_soon()

    def mark_dirty(self, name: str, *, gate: bool = True) -> None:
        """Re-fetch ``name``'s lists soon. With ``gate``, its tools are not called until the result is published."""
        self._requests.mark_dirty(name, gate=gate)

    def republish_soon(self) -> None:
        """Rebuild the view from the lists already fetched (a pin approval changed what is quarantined)."""
        self._requests.republish_soon()

    async def _refresher(self) -> None:
        while True:
            periodic: list[str] = []
            if not await self._requests.wait(self._interval):
                # Periodic refresh: catches silent definition changes (no list_changed) and applies pin approvals
                # made on another replica or from the CLI.
                periodic = [name for name in self._order if self._up[name]]
            # Debounce: a burst of list_changed notifications (an upstream adding ten tools) costs one refresh.
            await asyncio.sleep(self._debounce_s)
            dirty = self._requests.take(also=periodic)
            # Publish when there is something new to publish: a fetch that succeeded, a republish asked for, the
            # periodic round (pin approvals made elsewhere), or a publish that failed last time. A round whose
            # fetches all failed changed nothing; rebuilding for it would only churn (a gated upstream that stays
            # unreachable is retried over and over).
            publish = self._requests.take_republish() or bool(periodic) or self._publish_failed
            for item in sorted(dirty):
                member = self._members.get(item)
                if member is None:
                    continue
                try:
                    await self._load(item)
                    self._up[item] = True
                    self._gated_retry.pop(item, None)
                    publish = True
                except RequestError as exc:
                    log.warning("upstream.refresh_failed", upstream=item, error=exc.message, detail=exc.log_detail)
                    if isinstance(exc, UpstreamRpcError):  # an error answer is still an answer
                        self.gate.reachable(item)
                    else:
                        reason = f"list refresh failed: {exc.log_detail or exc.message}"
                        self.monitor.failed(item, reason)
                        if self.monitor.status(item).state != "restarting":
                            # Its tools' calls fail fast rather than wait for a refresh that cannot reach it. (A
                            # restarting transport is being re-established: its calls wait, as they do ungated.)
                            self.gate.unreachable(item, reason)
                    if self.gate.is_closed(item):
                        # Fail closed: the gated tools stay uncallable until a refresh succeeds; try again soon,
                        # then less often while it keeps failing.
                        delay = self._gated_retry.get(item, _GATED_RETRY_S)
                        self._gated_retry[item] = min(delay * 2, max(self._retry_max_s, _GATED_RETRY_S))
                        self._requests.retry(item, delay)
            if publish:
                await self._publish()

    async def refresh_now(self) -> None:
        """Re-fetch every live upstream and publish (used by tests and the admin CLI)."""
        for name in self._order:
            if self._up[name]:
                with contextlib.suppress(RequestError):
                    await self._load(name)
        await self._publish()

    async def _publish(self) -> None:
        ordered = {name: self._lists[name] for name in self._order if name in self._lists}
        fetched_at = dict(self._fetched_at)
        try:
            await self._on_change(ordered)
        except Exception:
            # The gates stay closed: calls must not reach definitions that were never checked.
            log.exception("catalogue.rebuild_failed")
            self._publish_failed = True
            return
        self._publish_failed = False
        self._published = ordered
        opened = self.gate.published(fetched_at)
        if opened:
            log.info("catalogue.gate_opened", upstreams=opened)

    async def _load(self, name: str) -> None:
        """Fetch ``name``'s lists and store them; a tools listing that differs from the published one gates the
        upstream's tools until the view built from it is published (a change nobody announced)."""
        generation = self.gate.generation(name)
        try:
            lists = await self._fetch(self._members[name])
        except RequestError as exc:
            if self._on_refresh is not None:
                self._on_refresh(name, "error" if isinstance(exc, UpstreamRpcError) else "failed")
            raise
        if self._on_refresh is not None:
            self._on_refresh(name, "ok")
        self.gate.reachable(name)  # it answered: calls wait for its gate (if closed) again
        previous = self._lists.get(name)
        if previous is not None and previous == lists:
            # The very object, not an equal one: the view publisher recognises unchanged lists by identity and
            # rebuilds nothing it derived from them (``bastion.view``), without comparing definitions again.
            lists = previous
        published = self._published.get(name)
        if published is not None and published is not lists and list(published.tools) != list(lists.tools):
            if not self.gate.is_closed(name):
                log.warning("catalogue.unannounced_change", upstream=name)
            self.gate.hold(name)
        self._lists[name] = lists
        self._fetched_at[name] = generation

    async def _fetch(self, member: Member) -> UpstreamLists:
        info = member.upstream.info
        caps = info.capabilities if info is not None else {}
        found: dict[str, list[Mapping[str, Any]]] = {}
        drops: list[LimitDrop] = []
        for attr, method, key in _LIST_METHODS:
            if _CAPABILITY[attr] not in caps:
                found[attr] = []
                continue
            budget = ListBudget(member.upstream.name, _kind(attr), self._limits)
            await self._paginate(member, method, key, budget)
            found[attr] = budget.items
            drops.extend(budget.drops())
        await self._report_limits(member.upstream.name, drops)
        return UpstreamLists(name=member.upstream.name, prefix=member.prefix, tools=found["tools"],
                             prompts=found["prompts"], resources=found["resources"], templates=found["templates"])

    async def _paginate(self, member: Member, method: str, key: str, budget: ListBudget) -> None:
        cursor: Any = None
        seen: set[str] = set()
        while True:
            params = {"cursor": cursor} if cursor is not None else None
            result = await member.upstream.request(method, params, timeout=member.timeout_s)
            page = result.get(key)
            if not await budget.add_page(page if isinstance(page, list) else []):
                return  # full: nothing on a further page could be kept
            cursor = result.get("nextCursor")
            # A hostile or buggy upstream that repeats a cursor must not loop the gateway forever.
            if cursor is None or not isinstance(cursor, str) or cursor in seen:
                return
            if not budget.pages_left:
                budget.more_pages_refused()
                return
            if not budget.admit_cursor(cursor):
                return  # its length counts against max_list_size, as it is kept in ``seen``
            seen.add(cursor)

    async def _report_limits(self, upstream: str, drops: list[LimitDrop]) -> None:
        """Warn and audit what the limits dropped, once per change: a periodic refresh that drops the same items
        again is not news."""
        signature = frozenset((d.list, d.limit, d.dropped) for d in drops)
        if signature == self._limit_seen.get(upstream, frozenset()):
            return
        self._limit_seen[upstream] = signature
        for drop in drops:
            log.warning("catalogue.limit", upstream=upstream, list=drop.list, limit=drop.limit, bound=drop.bound,
                        dropped=drop.dropped, names=list(drop.names))
            if self._on_limit is not None:
                try:
                    await self._on_limit(drop)
                except Exception:
                    log.exception("catalogue.limit_report_failed", upstream=upstream)


def _kind(attr: str) -> ListKind:
    kinds: dict[str, ListKind] = {"tools": "tools", "prompts": "prompts", "resources": "resources",
                                  "templates": "templates"}
    return kinds[attr]
