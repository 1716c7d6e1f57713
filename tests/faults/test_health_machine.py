"""The upstream health state machine and its monitor, in process (no sockets, no real sleeps beyond a few ms)."""

from __future__ import annotations

import asyncio
import random

import pytest

from bastion.errors import UpstreamRpcError, UpstreamUnavailable
from bastion.health import HealthConfig, HealthMonitor
from bastion.health import machine as m


def test_a_new_upstream_is_down_until_it_connects() -> None:
    h = m.initial(0.0)
    assert (h.state, h.reason, h.answering) == ("down", "not connected yet", False)
    h = m.connected(h, 5.0)
    assert (h.state, h.since, h.failures, h.answering) == ("up", 5.0, 0, True)


def test_failures_degrade_then_bring_it_down_and_one_answer_brings_it_back() -> None:
    h = m.connected(m.initial(0.0), 1.0)
    h = m.failed(h, 2.0, "connection refused", failures_to_down=3)
    assert (h.state, h.since, h.failures) == ("degraded", 2.0, 1)
    h = m.failed(h, 3.0, "connection refused", failures_to_down=3)
    assert (h.state, h.since, h.failures) == ("degraded", 2.0, 2)  # since moves only on a state change
    h = m.failed(h, 4.0, "probe timed out", failures_to_down=3)
    assert (h.state, h.reason, h.since) == ("down", "probe timed out", 4.0)
    assert m.refuses_calls(h)
    h = m.failed(h, 9.0, "still refused", failures_to_down=3)
    assert (h.state, h.reason, h.since, h.failures) == ("down", "still refused", 4.0, 4)
    h = m.succeeded(h, 10.0)
    assert (h.state, h.since, h.failures) == ("up", 10.0, 0)
    assert m.succeeded(h, 11.0) is h  # nothing changes, nothing allocated


def test_a_failure_of_a_request_sent_before_the_latest_reconnection_changes_nothing() -> None:
    """A request still out on a connection the transport replaced (a frozen HTTP session left for a new one)
    times out after the new connection answered: it says nothing about the new one."""
    h = m.connected(m.restarting(m.connected(m.initial(0.0), 1.0), 5.0, "frozen"), 6.0)
    assert m.failed(h, 7.0, "no answer in 2 s", failures_to_down=2, soft=True, sent_at=4.0) is h
    assert m.failed(h, 7.0, "probe failed", failures_to_down=1, sent_at=4.0) is h
    assert m.failed(h, 7.0, "no answer in 2 s", failures_to_down=2, soft=True, sent_at=6.5).state == "degraded"
    assert m.failed(h, 7.0, "refused", failures_to_down=1).state == "down"  # not known when sent: it counts


def test_the_public_reason_carries_no_upstream_text() -> None:
    """``/readyz`` answers anyone: a reason built from an upstream's error body, version string or message is
    reduced to bastion's own words, whatever the transition that recorded it."""
    secret = "db password=Xk9mQ2vL8pR4tZ7w AKIAIOSFODNN7EXAMPLE"
    up = m.connected(m.initial(0.0), 1.0)
    assert m.public_reason(up) == "connected"
    assert m.public_reason(m.initial(0.0)) == "not connected yet"
    assert m.public_reason(m.succeeded(m.failed(up, 2.0, "x", failures_to_down=1), 3.0)) == "answering"
    cases = [
        (m.failed(up, 2.0, f"probe failed: HTTP 500: b'{secret}'", failures_to_down=1), "probe failed"),
        (m.failed(up, 2.0, f"list refresh failed: {secret}", failures_to_down=1), "list refresh failed"),
        (m.failed(up, 2.0, f"HTTP 502: b'{secret}'", failures_to_down=3), "call failed"),
        (m.failed(up, 2.0, f"HTTP 502: b'{secret}'", failures_to_down=1), "unavailable"),
        (m.disconnected(up, 2.0, f"upstream answered initialize with version {secret!r}"), "unavailable"),
        (m.restarting(up, 2.0, f"stream ended: {secret}"), "restarting"),
        (m.restarting(up, 2.0, "stdout closed; exit code -9"), "restarting: exit code -9"),
        (m.restarting(up, 2.0, f"{secret}; exit code 3"), "restarting: exit code 3"),
        (m.failed(up, 2.0, f"probe failed{secret}", failures_to_down=1), "unavailable"),
    ]
    for health, public in cases:
        assert m.public_reason(health) == public, health.reason
        assert "Xk9m" not in m.public_reason(health)


def test_a_success_between_failures_resets_the_count() -> None:
    h = m.connected(m.initial(0.0), 0.0)
    h = m.failed(h, 1.0, "x", failures_to_down=2)
    h = m.succeeded(h, 2.0)
    h = m.failed(h, 3.0, "y", failures_to_down=2)
    assert h.state == "degraded"


def test_a_late_answer_to_a_request_sent_before_the_failure_changes_nothing() -> None:
    # An upstream shutting down finishes the calls it had accepted while refusing new ones: the answer to a call
    # sent at 1.5 arrives after the failures at 2 and 3, and says nothing about now.
    h = m.connected(m.initial(0.0), 1.0)
    h = m.failed(h, 2.0, "connection refused", failures_to_down=2)
    assert m.succeeded(h, 2.5, sent_at=1.5) is h  # still degraded, still counting
    h = m.failed(h, 3.0, "probe failed", failures_to_down=2)
    assert (h.state, h.failed_at) == ("down", 3.0)
    assert m.succeeded(h, 4.0, sent_at=1.5) is h
    assert m.succeeded(h, 4.0, sent_at=2.9) is h
    back = m.succeeded(h, 5.0, sent_at=3.5)  # a probe sent after the failure answered: it is back
    assert (back.state, back.since, back.failures) == ("up", 5.0, 0)
    assert m.succeeded(h, 5.0).state == "up"  # sent at an unknown time: counts, as before
    # Losing the connection or restarting counts as the latest failure too.
    gone = m.disconnected(m.connected(m.initial(0.0), 0.0), 6.0, "stream closed")
    assert m.succeeded(gone, 7.0, sent_at=5.0) is gone
    restarting = m.restarting(m.connected(m.initial(0.0), 0.0), 6.0, "exit code -9")
    assert m.succeeded(restarting, 7.0, sent_at=5.0) is restarting


def test_timed_out_calls_degrade_but_never_bring_an_upstream_down() -> None:
    h = m.connected(m.initial(0.0), 0.0)
    for at in (1.0, 2.0, 3.0, 4.0):
        h = m.failed(h, at, "did not answer within 5 s", failures_to_down=2, soft=True)
    assert (h.state, h.since, h.failures) == ("degraded", 1.0, 0)
    h = m.failed(h, 5.0, "probe failed: no answer in time", failures_to_down=2)
    h = m.failed(h, 6.0, "probe failed: no answer in time", failures_to_down=2)
    assert h.state == "down"  # the probe's own failures decide
    assert m.failed(h, 7.0, "slow", failures_to_down=2, soft=True) is h


def test_restarting_ignores_failures_until_the_transport_reconnects() -> None:
    h = m.connected(m.initial(0.0), 0.0)
    h = m.restarting(h, 1.0, "stdout closed; exit code -9")
    for at in (2.0, 3.0, 4.0):
        h = m.failed(h, at, "process not running", failures_to_down=1)
    assert (h.state, h.reason, h.since) == ("restarting", "stdout closed; exit code -9", 1.0)
    assert not m.refuses_calls(h)  # the supervisor decides: a call may wait for a reconnect under way
    assert m.connected(h, 5.0).state == "up"


def test_tools_are_hidden_only_after_the_grace_and_never_when_disabled() -> None:
    h = m.failed(m.connected(m.initial(0.0), 0.0), 10.0, "gone", failures_to_down=1)
    assert not m.hidden(h, 39.9, 30.0)
    assert m.hidden(h, 40.0, 30.0)
    assert not m.hidden(h, 1e9, None)
    assert m.hidden(m.restarting(m.initial(0.0), 0.0, "r"), 0.0, 0.0)
    assert not m.hidden(m.failed(m.connected(m.initial(0.0), 0.0), 1.0, "slow", failures_to_down=2), 99.0, 0.0)


def test_config_defaults_and_errors() -> None:
    from bastion.errors import ConfigError

    assert HealthConfig.from_mapping(None) == HealthConfig()
    cfg = HealthConfig.from_mapping({"probe_interval": "0", "hide_after": None, "failures_to_down": 1})
    assert (cfg.probe_interval_s, cfg.hide_after_s, cfg.failures_to_down) == (0.0, None, 1)
    for bad in ({"probe_jitter": 1.5}, {"failures_to_down": 0}, {"recovery_interval": 0}, {"nope": 1}):
        with pytest.raises(ConfigError):
            HealthConfig.from_mapping(bad)


class FakeUpstream:
    """A probe target whose answers the test scripts: True (answer), an exception (failure)."""

    def __init__(self) -> None:
        self.answer: BaseException | None = None
        self.probes = 0

    async def probe(self, name: str, timeout: float) -> bool:
        self.probes += 1
        if self.answer is not None:
            raise self.answer
        return True


async def _until(predicate: object, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.005)


async def test_a_failed_call_is_confirmed_by_an_immediate_probe_then_hidden_and_announced() -> None:
    cfg = HealthConfig(probe_interval_s=3600, recovery_interval_s=0.05, probe_jitter=0.0, failures_to_down=2,
                       hide_after_s=0.1)
    monitor = HealthMonitor(["a", "b"], cfg, rng=random.Random(1))
    target = FakeUpstream()
    monitor.probe = target.probe
    transitions: list[tuple[str, str, str]] = []
    hidden: list[frozenset[str]] = []
    recovered: list[str] = []
    monitor.on_transition = lambda name, old, new: transitions.append((name, old.state, new.state))
    monitor.on_recovered = recovered.append

    async def on_hidden(names: frozenset[str]) -> None:
        hidden.append(names)

    monitor.on_hidden = on_hidden
    monitor.connected("a")
    monitor.connected("b")
    monitor.start()
    try:
        target.answer = UpstreamUnavailable("a", log_detail="connection refused")
        monitor.failed("a", "POST: ConnectError")  # the passive signal: one failed call
        assert monitor.status("a").state == "degraded"
        await _until(lambda: monitor.status("a").state == "down")  # the probe confirmed it, within ms
        assert target.probes == 1
        with pytest.raises(UpstreamUnavailable):
            monitor.check("a")
        monitor.check("b")
        await _until(lambda: hidden)
        assert hidden[-1] == frozenset({"a"})
        assert monitor.snapshot()["a"]["tools_hidden"] is True
        assert monitor.snapshot()["a"]["state"] == "down"
        target.answer = UpstreamRpcError(-32601, "Method not found")  # an error answer proves it is alive
        await _until(lambda: monitor.status("a").state == "up")
        await _until(lambda: hidden[-1] == frozenset())
        assert recovered == ["a", "b", "a"]
        assert ("a", "degraded", "down") in transitions and ("a", "down", "up") in transitions
    finally:
        await monitor.close()


async def test_probe_cadence_follows_the_state_with_jitter() -> None:
    cfg = HealthConfig(probe_interval_s=0.2, recovery_interval_s=0.02, probe_jitter=0.5, hide_after_s=None)
    monitor = HealthMonitor(["a"], cfg)
    target = FakeUpstream()
    monitor.probe = target.probe
    monitor.connected("a")
    monitor.start()
    try:
        await asyncio.sleep(0.35)
        healthy = target.probes
        assert 1 <= healthy <= 4
        target.answer = UpstreamUnavailable("a")
        monitor.failed("a", "x")
        await asyncio.sleep(0.35)
        assert target.probes - healthy >= 5  # recovery cadence: far more often
    finally:
        await monitor.close()


async def test_a_suspect_signal_probes_at_once_without_counting_as_a_failure() -> None:
    cfg = HealthConfig(probe_interval_s=3600, recovery_interval_s=3600, probe_jitter=0.0, hide_after_s=None)
    monitor = HealthMonitor(["a"], cfg)
    target = FakeUpstream()
    monitor.probe = target.probe
    monitor.connected("a")
    monitor.start()
    try:
        monitor.suspect("a", "GET stream ended")
        assert monitor.status("a").state == "up"  # a stream may end for good reasons: nothing counted yet
        await _until(lambda: target.probes == 1)
        assert monitor.status("a").state == "up"
        target.answer = UpstreamUnavailable("a", log_detail="connection refused")
        await asyncio.sleep(0.25)  # past the minimum gap between probes
        monitor.suspect("a", "GET stream ended")
        await _until(lambda: monitor.status("a").state == "degraded")
        assert "connection refused" in monitor.status("a").reason
    finally:
        await monitor.close()


async def test_a_late_answer_does_not_recover_a_down_upstream_but_a_later_probe_does() -> None:
    cfg = HealthConfig(probe_interval_s=3600, recovery_interval_s=0.05, probe_jitter=0.0, failures_to_down=2,
                       hide_after_s=None)
    monitor = HealthMonitor(["a"], cfg)
    target = FakeUpstream()
    monitor.probe = target.probe
    recovered: list[str] = []
    monitor.on_recovered = recovered.append
    monitor.connected("a")
    recovered.clear()
    monitor.start()
    try:
        sent = monitor.now()  # a call goes out
        target.answer = UpstreamUnavailable("a", log_detail="connection refused")
        monitor.failed("a", "POST: ConnectError")  # another call fails; the probe confirms
        await _until(lambda: monitor.status("a").state == "down")
        monitor.succeeded("a", sent_at=sent)  # the first call's answer arrives, late
        assert monitor.status("a").state == "down" and recovered == []
        assert monitor.snapshot()["a"]["state"] == "down"
        target.answer = None
        await _until(lambda: monitor.status("a").state == "up")  # a probe sent after the failure answered
        assert recovered == ["a"]
    finally:
        await monitor.close()


async def test_a_probe_answer_made_stale_by_a_failure_meanwhile_is_followed_by_another_probe() -> None:
    cfg = HealthConfig(probe_interval_s=3600, recovery_interval_s=3600, probe_jitter=0.0, failures_to_down=3,
                       hide_after_s=None)
    monitor = HealthMonitor(["a"], cfg)
    entered, release = asyncio.Event(), asyncio.Event()
    probes: list[float] = []

    async def probe(name: str, timeout: float) -> bool:
        probes.append(monitor.now())
        if len(probes) == 1:
            entered.set()
            await release.wait()
        return True

    monitor.probe = probe
    monitor.connected("a")
    monitor.start()
    try:
        monitor.suspect("a", "stream ended")  # the first probe goes out and is held
        await asyncio.wait_for(entered.wait(), 2)
        monitor.failed("a", "POST: ConnectError")  # a call fails while the probe is out
        release.set()
        await _until(lambda: len(probes) == 2)  # its answer was stale: probed again, not after an hour
        await _until(lambda: monitor.status("a").state == "up")
    finally:
        await monitor.close()


def test_a_connection_replaced_for_not_answering_is_up_only_once_it_answers() -> None:
    """A server that answers its handshake and nothing else (it freezes every session it opens, or hangs right
    after ``initialize``) was ``up`` after every restart, until probes failed again: ready and counted up nearly
    all the time while no call could succeed."""
    h = m.failed(m.failed(m.connected(m.initial(0.0), 1.0), 2.0, "probe failed", failures_to_down=2), 3.0,
                 "probe failed", failures_to_down=2)
    assert h.state == "down"
    h = m.restarted(h)
    h = m.restarting(h, 3.5, "unresponsive, restarted")  # a supervised transport says so; Streamable HTTP not
    h = m.connected(h, 4.0)
    assert (h.state, h.reason, h.answering, h.on_trial) == ("restarting", "reconnected, waiting for an answer",
                                                            False, True)
    assert m.public_reason(h) == "reconnected, waiting for an answer"
    assert m.failed(h, 4.5, "slow tool", failures_to_down=2, soft=True, sent_at=4.1) is h  # a timeout proves nothing
    failed = m.failed(h, 5.0, "probe failed", failures_to_down=2, sent_at=4.1)
    assert (failed.state, failed.on_trial) == ("down", False)  # the pool replaces it again
    answered = m.succeeded(h, 5.0, sent_at=4.1)
    assert (answered.state, answered.replaced, answered.on_trial) == ("up", False, False)
    # Hidden from when it stopped answering (3.0), not from its latest move between down and restarting: its
    # tools do not come back into the lists each time it is restarted.
    assert m.hidden(failed, 3.0 + 30.0, 30.0) and failed.since == 5.0
    # A reconnection nobody asked for (a stream that ended) is up on its handshake, as before.
    h = m.connected(m.restarting(answered, 6.0, "stream ended"), 7.0)
    assert (h.state, h.reason) == ("up", "connected")


async def test_the_monitor_probes_a_connection_on_trial_at_once() -> None:
    probes: list[str] = []
    answering = False

    async def probe(name: str, timeout: float) -> bool:
        probes.append(name)
        if not answering:
            raise UpstreamUnavailable(name, log_detail="frozen")
        return True

    cfg = HealthConfig(probe_interval_s=3600.0, recovery_interval_s=3600.0, probe_jitter=0.0)
    monitor = HealthMonitor(["u"], cfg, probe=probe)
    monitor.connected("u")
    monitor.start()
    try:
        monitor.failed("u", "probe failed")
        monitor.failed("u", "probe failed")
        await asyncio.sleep(0)
        assert monitor.status("u").state == "down"
        monitor.restarted("u")
        answering = True
        probes.clear()
        monitor.connected("u")
        assert monitor.status("u").state == "restarting"
        for _ in range(500):
            if monitor.status("u").state == "up":
                break
            await asyncio.sleep(0.01)
        assert monitor.status("u").state == "up" and probes
    finally:
        await monitor.close()
