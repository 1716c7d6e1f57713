"""Feeds the health machine of every upstream and acts on what it says.

Inputs: passive signals (each forwarded call's outcome, reported by the gateway; connects, losses and restarts,
reported by the pool and the transports) and an active probe per upstream (``ping`` for handshake-era
upstreams, ``server/discover`` for 2026-07-28 ones, chosen by the pool), on ``probe_interval`` while healthy and
``recovery_interval`` while not, each with jitter. A failed call wakes the probe at once, so a dead upstream that
gets traffic is declared down within one probe round trip rather than one interval.

Outputs: ``status``/``snapshot`` (readiness, the tools/list audit record), ``check`` (calls to a down upstream
fail fast with -31002), ``on_transition`` (metrics and the log line), ``on_recovered`` (the pool refreshes its
lists) and ``on_hidden`` (the set of upstreams whose tools leave the lists, published after ``hide_after``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import structlog

from bastion.errors import RequestError, UpstreamRpcError, UpstreamUnavailable
from bastion.health import machine as m
from bastion.health.config import HealthConfig
from bastion.health.machine import Health
from bastion.stopping import cancel_and_wait

__all__ = ["HealthMonitor"]

log = structlog.get_logger("bastion.health")

# Never probe one upstream more often than this, whatever a burst of failed calls asks for.
_MIN_PROBE_GAP_S = 0.2

Probe = Callable[[str, float], Awaitable[bool]]  # (upstream, timeout) -> False when there is nothing to probe
Transition = Callable[[str, Health, Health], None]


def _ignore_transition(name: str, old: Health, new: Health) -> None:
    return None


def _ignore_recovered(name: str) -> None:
    return None


async def _ignore_hidden(names: frozenset[str]) -> None:
    return None


class HealthMonitor:
    def __init__(self, names: Iterable[str], config: HealthConfig, *, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic, probe: Probe | None = None,
                 on_transition: Transition | None = None, on_recovered: Callable[[str], None] | None = None,
                 on_hidden: Callable[[frozenset[str]], Awaitable[None]] | None = None) -> None:
        self.config = config
        self._clock = clock
        self._rng = rng or random.Random()
        now = clock()
        self._health: dict[str, Health] = {name: m.initial(now) for name in names}
        self._wake = {name: asyncio.Event() for name in self._health}
        self._probe_soon: set[str] = set()
        self._hidden: frozenset[str] = frozenset()
        self._tasks: list[asyncio.Task[None]] = []
        self.probe = probe
        self.on_transition = on_transition or _ignore_transition
        self.on_recovered = on_recovered or _ignore_recovered
        self.on_hidden = on_hidden or _ignore_hidden

    # -- what others read -------------------------------------------------------------------------------------

    def status(self, name: str) -> Health:
        return self._health[name]

    def answering(self) -> dict[str, bool]:
        return {name: h.answering for name, h in self._health.items()}

    @property
    def hidden(self) -> frozenset[str]:
        return self._hidden

    def snapshot(self, *, public: bool = False) -> dict[str, dict[str, Any]]:
        """Per upstream: state, reason, since (UTC, ISO 8601), seconds in this state, tools hidden or not.
        ``public``: for readers who did not authenticate (``/readyz``), the reason in bastion's own words only
        (``machine.public_reason``)."""
        now, wall = self._clock(), time.time()
        out: dict[str, dict[str, Any]] = {}
        for name, h in self._health.items():
            age = max(0.0, now - h.since)
            out[name] = {"state": h.state, "reason": m.public_reason(h) if public else h.reason,
                         "since": datetime.fromtimestamp(wall - age, UTC).isoformat(timespec="milliseconds"),
                         "for_s": round(age, 3), "tools_hidden": name in self._hidden}
        return out

    def check(self, name: str) -> None:
        """Raise ``UpstreamUnavailable`` now when the upstream is known to be down (no wait on a dead socket)."""
        health = self._health.get(name)
        if health is not None and m.refuses_calls(health):
            raise UpstreamUnavailable(name, log_detail=f"upstream is down: {health.reason}")

    # -- signals ------------------------------------------------------------------------------------------------

    def now(self) -> float:
        """The monitor's clock: what a caller reads before sending a request, for ``succeeded(sent_at=...)``."""
        return self._clock()

    def succeeded(self, name: str, sent_at: float | None = None) -> None:
        """An answer arrived. ``sent_at`` (``now()`` when the request was sent): an answer to a request sent
        before the latest failure is stale and changes nothing (``machine.succeeded``)."""
        health = self._health.get(name)
        if health is not None and (health.state != "up" or health.failures):
            self._set(name, m.succeeded(health, self._clock(), sent_at))

    def failed(self, name: str, reason: str, *, soft: bool = False, sent_at: float | None = None) -> None:
        """A call at the transport level failed: count it (``soft``: a timeout, see ``machine.failed``) and
        confirm with a probe right away. ``sent_at`` (``now()`` when the request was sent): a request sent before
        the transport's latest (re)connection failed on the connection it replaced, and changes nothing."""
        health = self._health.get(name)
        if health is None:
            return
        new = m.failed(health, self._clock(), reason, failures_to_down=self.config.failures_to_down, soft=soft,
                       sent_at=sent_at)
        if new is health:
            return
        self._set(name, new)
        self._probe_soon.add(name)
        self._wake[name].set()

    def suspect(self, name: str, reason: str) -> None:
        """A sign of trouble that is not a failure by itself (a stream the server may end at will): probe now."""
        if name in self._health:
            log.debug("upstream.health_suspect", upstream=name, reason=reason)
            self._probe_soon.add(name)
            self._wake[name].set()

    def connected(self, name: str) -> None:
        if name in self._health:
            new = m.connected(self._health[name], self._clock())
            self._set(name, new)
            if new.on_trial:
                # The request that decides: at once, not at the next recovery interval.
                self._probe_soon.add(name)
                self._wake[name].set()

    def disconnected(self, name: str, reason: str) -> None:
        if name in self._health:
            self._set(name, m.disconnected(self._health[name], self._clock(), reason))

    def restarted(self, name: str) -> None:
        """The pool replaces the upstream's connection because it stopped answering: once reconnected, it is up
        only when a request on the new connection is answered (``machine.restarted``)."""
        if name in self._health:
            self._set(name, m.restarted(self._health[name]))

    def restarting(self, name: str, reason: str) -> None:
        if name in self._health:
            self._set(name, m.restarting(self._health[name], self._clock(), reason))

    def _set(self, name: str, new: Health) -> None:
        old = self._health[name]
        self._health[name] = new
        if new.state == old.state:
            return
        (log.info if new.answering else log.warning)("upstream.health", upstream=name, state=new.state,
                                                     previous=old.state, reason=new.reason)
        self.on_transition(name, old, new)
        if new.answering and not old.answering:
            self.on_recovered(name)
        self._wake[name].set()

    # -- the loops ------------------------------------------------------------------------------------------

    def start(self) -> None:
        for name in self._health:
            self._tasks.append(asyncio.create_task(self._watch(name), name=f"bastion-health-{name}"))

    async def close(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    def _interval(self, health: Health) -> float:
        base = self.config.probe_interval_s if health.state == "up" else self.config.recovery_interval_s
        if base <= 0:
            return math.inf
        return base * (1 + self._rng.uniform(-self.config.probe_jitter, self.config.probe_jitter))

    def _hide_at(self, health: Health) -> float | None:
        hide_after = self.config.hide_after_s
        if hide_after is None or health.state not in ("down", "restarting"):
            return None
        return health.unavailable_since + hide_after

    async def _watch(self, name: str) -> None:
        wake = self._wake[name]
        last_probe = -math.inf
        next_probe = self._clock() + self._interval(self._health[name])
        state = self._health[name].state
        while True:
            now = self._clock()
            wait = next_probe - now
            hide_at = self._hide_at(self._health[name])
            if hide_at is not None and name not in self._hidden:
                wait = min(wait, hide_at - now)
            if wait > 0 and not wake.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if math.isinf(wait) else wait):
                        await wake.wait()
            wake.clear()
            now = self._clock()
            health = self._health[name]
            if health.state != state:
                # A new state has its own cadence (a recovered upstream goes back to the slow interval).
                state = health.state
                next_probe = now + self._interval(health)
            if name in self._probe_soon:
                self._probe_soon.discard(name)
                next_probe = min(next_probe, max(now, last_probe + _MIN_PROBE_GAP_S))
            await self._publish_hidden()
            if self._clock() >= next_probe:
                await self._probe_once(name)
                last_probe = self._clock()
                state = self._health[name].state
                next_probe = last_probe + self._interval(self._health[name])
                await self._publish_hidden()

    async def _probe_once(self, name: str) -> None:
        health = self._health[name]
        if self.probe is None or (health.state == "restarting" and not health.on_trial):
            self._probe_soon.discard(name)
            return  # a restarting transport reports for itself when it is back (on trial, a probe decides)
        timeout = self.config.probe_timeout_s
        sent = self._clock()
        try:
            # The outer deadline bounds the probe even if a transport's own clean-up were to hang.
            async with asyncio.timeout(timeout + 1.0):
                probed = await self.probe(name, timeout)
        except UpstreamRpcError:
            probed = True  # an error answer is an answer: the upstream is there
        except (RequestError, TimeoutError) as exc:
            message = (exc.log_detail or exc.message) if isinstance(exc, RequestError) else "no answer in time"
            self.failed(name, f"probe failed: {message}", sent_at=sent)
            self._probe_soon.discard(name)
            return
        if probed:
            self.succeeded(name, sent_at=sent)
        if self._health[name].failed_at <= sent:
            # A failure seen while this probe was out made its answer stale: that failure's own request for a
            # probe stays, and the next probe (at least ``_MIN_PROBE_GAP_S`` later) decides.
            self._probe_soon.discard(name)

    async def _publish_hidden(self) -> None:
        now = self._clock()
        hidden = frozenset(name for name, h in self._health.items()
                           if m.hidden(h, now, self.config.hide_after_s))
        if hidden == self._hidden:
            return
        self._hidden = hidden
        log.info("catalogue.upstreams_hidden", upstreams=sorted(hidden))
        try:
            await self.on_hidden(hidden)
        except Exception:
            log.exception("catalogue.hide_failed")
