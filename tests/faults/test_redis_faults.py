"""Redis killed (SIGKILL) and restarted on the same port under a bounded load of MCP calls through a real gateway.

A real redis-server, a real ``bastion serve`` process and a real stdio upstream; the load is legacy-era sessions
over plain HTTP (exact control of ids and deadlines). Redis holds sessions, rate limits and concurrency leases, pins
and an audit stream at once. The test asserts what docs/operations.md ("Redis outages") promises:

- nothing hangs: every request answers within its deadline, during the outage as well;
- during the outage each use behaves as documented: known sessions keep working, new sessions open, the limiter
  applies its ``failure_mode``, the catalogue keeps the tools its last verified pins vouch for;
- from the first request after the restart on, no refusal of any kind (the requests in flight at the moment of the
  restart excepted), with the restarted Redis empty (no persistence): sessions written back, pins re-established;
- every answered call has its audit record, and every call after the restart reaches the Redis stream as well.

Run with ``-s`` to see the measured figures (error window, recovery time) recorded in docs/operations.md.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from bastion.audit.record import arguments_digest
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import ACCEPT, parse_body

WORKERS = 4
PAUSE_S = 0.02  # between one worker's calls: a bounded load (~150 calls/s in all on the test machine)
DEADLINE_S = 5.0  # a request's deadline; the documented bounds are far below it (1 s sessions, 250 ms limiter)
OUTAGE_S = 2.5
AUDIT_STREAM = "bastion:audit"
LIMITER_UNAVAILABLE = -31004


@dataclass(slots=True)
class Outcome:
    started: float
    ended: float
    kind: str  # "call" or "initialize"
    status: int  # HTTP status, 0 when no answer arrived (deadline)
    ok: bool
    code: int | None = None  # JSON-RPC error code
    request_id: int | None = None


@dataclass(slots=True)
class Load:
    url: str
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def initialize(self, http: httpx.Client) -> str | None:
        started = time.monotonic()
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "faults", "version": "1"}}}
        try:
            r = http.post(self.url, content=orjson.dumps(body), headers=_headers(None))
        except httpx.HTTPError:
            self.record(Outcome(started, time.monotonic(), "initialize", 0, False))
            return None
        sid = r.headers.get("mcp-session-id")
        self.record(Outcome(started, time.monotonic(), "initialize", r.status_code, r.status_code == 200))
        if sid is not None:
            http.post(self.url, content=orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                      headers=_headers(sid))
        return sid

    def call(self, http: httpx.Client, sid: str) -> Outcome:
        rid = next(self.ids)
        body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                "params": {"name": "basic__echo", "arguments": {"message": f"m{rid}"}}}
        started = time.monotonic()
        try:
            r = http.post(self.url, content=orjson.dumps(body), headers=_headers(sid))
        except httpx.HTTPError:
            outcome = Outcome(started, time.monotonic(), "call", 0, False, request_id=rid)
        else:
            answer = next((m for m in parse_body(r) if m.get("id") == rid), {}) if r.status_code == 200 else {}
            ok = answer.get("result", {}).get("content", [{}])[0].get("text") == f"m{rid}"
            code = answer.get("error", {}).get("code")
            outcome = Outcome(started, time.monotonic(), "call", r.status_code, ok, code, rid)
        self.record(outcome)
        return outcome

    def worker(self) -> None:
        """One client: one session for its whole life (it must survive the outage), calling in a loop."""
        with httpx.Client(timeout=DEADLINE_S) as http:
            sid = None
            while sid is None and not self.stop.is_set():
                sid = self.initialize(http)
            while sid is not None and not self.stop.is_set():
                self.call(http, sid)
                time.sleep(PAUSE_S)

    def opener(self) -> None:
        """A client that keeps opening fresh sessions (one call each): session creation during and after."""
        with httpx.Client(timeout=DEADLINE_S) as http:
            while not self.stop.is_set():
                sid = self.initialize(http)
                if sid is not None:
                    self.call(http, sid)
                time.sleep(0.1)


def _headers(sid: str | None) -> dict[str, str]:
    h = {"Accept": ACCEPT, "Content-Type": "application/json"}
    if sid is not None:
        h |= {"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
    return h


def gateway_config(redis_url: str, failure_mode: str) -> dict[str, Any]:
    return {
        "auth": "none",
        "redis": {"url": redis_url},
        "upstreams": {"basic": stdio_upstream()},
        # Refresh often, so catalogue refreshes (and pin checks) happen during the outage.
        "catalogue": {"refresh_interval": "1s", "refresh_debounce": "50ms"},
        "rate_limits": {"failure_mode": failure_mode, "timeout": "250ms",
                        "defaults": [{"name": "generous", "rate": "100000/second", "per": "principal"}],
                        "concurrency": [{"name": "inflight", "max": 64, "per": "principal"}]},
        "audit": {"sinks": ["stdout", {"redis_stream": AUDIT_STREAM, "timeout_ms": 500}]},
    }


def tool_names(url: str) -> list[str]:
    """tools/list through a fresh session (or 503 while no session can be opened at all)."""
    load = Load(url)
    with httpx.Client(timeout=DEADLINE_S) as http:
        sid = load.initialize(http)
        assert sid is not None
        r = http.post(url, content=orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
                      headers=_headers(sid))
        return [t["name"] for t in parse_body(r)[-1]["result"]["tools"]]


def metric(gw: GatewayProcess, series: str) -> float:
    text = httpx.get(gw.base + "/metrics", timeout=5).text
    match = re.search(rf"^{re.escape(series)} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def log_events(gw: GatewayProcess) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in gw.stderr().splitlines() if line.startswith("{")]


@pytest.fixture
def redis_proc(private_redis: RedisServer) -> RedisServer:
    return private_redis


@pytest.mark.parametrize("failure_mode", ["open", "closed"])
def test_redis_killed_and_restarted_under_load(tmp_path: Path, redis_proc: RedisServer, failure_mode: str) -> None:
    gw = GatewayProcess(gateway_config(redis_proc.url, failure_mode), tmp_path).start()
    load = Load(gw.url)
    threads = [threading.Thread(target=load.worker, daemon=True) for _ in range(WORKERS)]
    threads.append(threading.Thread(target=load.opener, daemon=True))
    try:
        assert "basic__echo" in tool_names(gw.url)
        for t in threads:
            t.start()
        time.sleep(1.5)

        redis_proc.kill()
        killed = time.monotonic()
        time.sleep(OUTAGE_S / 2)
        # Mid-outage: the catalogue still serves the verified tools (no quarantine), a new session opens, and the
        # gauges say Redis is down for sessions.
        assert "basic__echo" in tool_names(gw.url)
        assert metric(gw, 'bastion_redis_up{use="sessions"}') == 0
        # Readiness reports Redis down but stays ready: every replica leaving the Service would be a total outage.
        ready = httpx.get(gw.base + "/readyz", timeout=5)
        assert (ready.status_code, ready.json()["checks"]["redis"]) == (200, False)
        time.sleep(OUTAGE_S / 2)

        # Redis may answer from the moment start() begins (it returns once the port answers): the outage window
        # ends there, and "after" begins once start() has returned.
        restarting = time.monotonic()
        redis_proc.start()  # same port, empty (no persistence)
        restarted = time.monotonic()
        time.sleep(3.0)
        assert "basic__echo" in tool_names(gw.url)
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=2 * DEADLINE_S)
    try:
        check_outcomes(load.outcomes, killed, restarting, restarted, failure_mode)
        check_audit(gw, redis_proc, load.outcomes, restarted)
        check_operator_view(gw, failure_mode)
    finally:
        gw.stop()


def check_outcomes(outcomes: list[Outcome], killed: float, restarting: float, restarted: float,
                   failure_mode: str) -> None:
    # Nothing hangs: every request was answered, well within its deadline.
    assert all(o.status != 0 for o in outcomes), [o for o in outcomes if o.status == 0][:3]
    slowest = max(o.ended - o.started for o in outcomes)
    assert slowest < DEADLINE_S / 2

    before = [o for o in outcomes if o.ended < killed]
    during = [o for o in outcomes if o.started > killed and o.ended < restarting]
    in_flight = [o for o in outcomes if o.started <= restarted and o.ended >= restarting]
    after = [o for o in outcomes if o.started > restarted]
    assert before and during and after
    assert all(o.ok for o in before)

    # During the outage: sessions never fail (known ones served from this replica, new ones opened here) ...
    assert all(o.status == 200 for o in during), sorted({(o.kind, o.status) for o in during})
    assert any(o.kind == "initialize" for o in during)
    calls = [o for o in during if o.kind == "call"]
    # ... and the limiter applies its declared failure mode to every call.
    if failure_mode == "open":
        assert all(o.ok for o in calls), sorted({(o.status, str(o.code)) for o in calls if not o.ok})
    else:
        assert calls and all(o.code == LIMITER_UNAVAILABLE for o in calls), \
            sorted({(o.ok, o.status, str(o.code)) for o in calls})

    # After the restart: not one refusal, from the first request on.
    failed_after = [o for o in after if not o.ok]
    assert failed_after == [], failed_after[:5]

    failures = [o for o in outcomes if not o.ok]
    window = (max(o.ended for o in failures) - restarted) if failures else 0.0
    first_second = [o for o in after if o.started < restarted + 1.0]
    slowest_after = max(o.ended - o.started for o in first_second) if first_second else 0.0
    print(f"\n[redis faults, failure_mode={failure_mode}] requests={len(outcomes)} during outage={len(during)} "
          f"(failed {sum(not o.ok for o in during)}) in flight at restart={len(in_flight)} "
          f"(failed {sum(not o.ok for o in in_flight)}) after restart={len(after)} (failed {len(failed_after)}); "
          f"last failure ended {window * 1000:+.0f} ms from the restart; started in the first second after it: "
          f"{len(first_second)}, slowest {slowest_after * 1000:.0f} ms; slowest request {slowest * 1000:.0f} ms")


def digest(o: Outcome) -> str:
    """A call's identity in its audit record: each call's arguments are unique (``m<id>``)."""
    return arguments_digest({"message": f"m{o.request_id}"})


def check_audit(gw: GatewayProcess, redis_proc: RedisServer, outcomes: list[Outcome], restarted: float) -> None:
    answered = {digest(o) for o in outcomes if o.kind == "call" and o.status == 200}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        recorded = {r.get("arguments_digest") for r in gw.records("tool.call")}
        if answered <= recorded:
            break
        time.sleep(0.1)
    # No lost audit records: every answered call has its record on stdout, outage or not.
    assert len(answered - recorded) == 0, len(answered - recorded)
    # Every call after the restart also reached the Redis stream (the restarted Redis started empty).
    client = redis.Redis.from_url(redis_proc.url)
    try:
        streamed = {orjson.loads(fields[b"record"]).get("arguments_digest")
                    for _, fields in client.xrange(AUDIT_STREAM)}
    finally:
        client.close()
    after = {digest(o) for o in outcomes if o.kind == "call" and o.started > restarted}
    assert after and len(after - streamed) == 0, len(after - streamed)


def check_operator_view(gw: GatewayProcess, failure_mode: str) -> None:
    events = [e.get("event") for e in log_events(gw)]
    # An outage is logged per use when it starts and when it ends, not per request: a few lines for hundreds of
    # requests. (On a CPU-starved machine a round trip over its bound counts as a brief outage of its own, hence
    # "a few" rather than exactly one.)
    for start, end in (("session_store.unavailable", "session_store.recovered"),
                       ("ratelimit.redis_unavailable", "ratelimit.redis_recovered")):
        assert 1 <= events.count(start) <= 5, (start, events.count(start))
        assert events.count(end) == events.count(start), (end, events.count(end))
    assert "session_store.reseeded" in events  # the restarted Redis came back empty: sessions written back
    pin_failures = [e for e in log_events(gw) if e.get("event") == "pin.unavailable"]
    assert pin_failures and all(e["mode"] == "static" and e["quarantined"] == 0 for e in pin_failures)
    assert metric(gw, 'bastion_redis_up{use="sessions"}') == 1
    assert metric(gw, 'bastion_redis_up{use="limiter"}') == 1
    assert metric(gw, 'bastion_redis_up{use="pins"}') == 1
    assert metric(gw, 'bastion_session_store_fallbacks_total{event="served_local"}') > 0
    assert metric(gw, 'bastion_session_store_fallbacks_total{event="created_local"}') > 0
    assert metric(gw, 'bastion_pin_store_failures_total{mode="static"}') > 0
    assert metric(gw, 'bastion_pin_store_failures_total{mode="closed"}') == 0
    assert metric(gw, 'bastion_audit_sink_failures_total{sink="redis:bastion:audit"}') > 0
    # The audit log alone says which calls went through uncounted (open), and none did otherwise.
    degraded = [r for r in gw.records("tool.call") if r.get("ratelimit_degraded")]
    assert (len(degraded) > 0) == (failure_mode == "open"), len(degraded)


def test_redis_down_at_start_then_up_restores_pinned_tools_within_seconds(tmp_path: Path) -> None:
    """Nothing was ever verified (fail closed): the tools are hidden, and come back within seconds of Redis
    answering, through the pin re-check, not at the next periodic refresh a minute later."""
    redis_proc = RedisServer()  # its port is reserved, nothing listens yet
    config = {**gateway_config(redis_proc.url, "open"), "catalogue": {"refresh_interval": "60s"}}
    gw = GatewayProcess(config, tmp_path).start()
    try:
        # Sessions open (kept on this replica) and lists answer at once; the unverified tools are hidden.
        started = time.monotonic()
        assert "basic__echo" not in tool_names(gw.url)
        assert time.monotonic() - started < DEADLINE_S / 2
        closed = [e for e in log_events(gw) if e.get("event") == "pin.unavailable"]
        assert closed and closed[0]["mode"] == "closed"

        redis_proc.start()
        back = time.monotonic()
        while "basic__echo" not in tool_names(gw.url):
            assert time.monotonic() - back < 10, "tools still hidden 10 s after Redis came up"
            time.sleep(0.2)
        print(f"\n[redis faults] tools restored {(time.monotonic() - back) * 1000:.0f} ms after Redis came up")
        assert metric(gw, 'bastion_redis_up{use="pins"}') == 1
    finally:
        gw.stop()
        redis_proc.stop()


def gauge(gw: GatewayProcess, series: str) -> float | None:
    """The series' value, or ``None`` when it is not exported (unlike ``metric``, absence is not 0)."""
    text = httpx.get(gw.base + "/metrics", timeout=5).text
    match = re.search(rf"^{re.escape(series)} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else None


REDIS_GAUGES = ('bastion_redis_up{use="sessions"}', 'bastion_redis_up{use="limiter"}', "bastion_limiter_redis_up")


def test_redis_gauges_are_measured_from_start(tmp_path: Path) -> None:
    """Nothing listens at the configured Redis from the start, and no request arrives: every use's gauge says 0,
    as /readyz does (an idle replica must fire BastionRedisDown / BastionLimiterRedisDown). Once Redis answers,
    the first operation of each use brings its gauge to 1."""
    redis_proc = RedisServer()  # its port is reserved, nothing listens yet
    gw = GatewayProcess(gateway_config(redis_proc.url, "open"), tmp_path).start(expect_ready=False)
    try:
        assert httpx.get(gw.base + "/readyz", timeout=5).json()["checks"]["redis"] is False
        assert {series: gauge(gw, series) for series in REDIS_GAUGES} == dict.fromkeys(REDIS_GAUGES, 0.0)

        redis_proc.start()
        back = time.monotonic()
        with httpx.Client(timeout=DEADLINE_S) as http:
            while True:
                load = Load(gw.url)
                sid = load.initialize(http)
                if sid is not None:
                    http.post(gw.url, headers=_headers(sid), content=orjson.dumps(
                        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "basic__echo", "arguments": {"message": "up"}}}))
                if all(gauge(gw, series) == 1 for series in REDIS_GAUGES):
                    break
                assert time.monotonic() - back < 10, {series: gauge(gw, series) for series in REDIS_GAUGES}
                time.sleep(0.2)
    finally:
        gw.stop()
        redis_proc.stop()


def test_redis_gauges_start_at_one_when_redis_answers(tmp_path: Path, redis_proc: RedisServer) -> None:
    """Measured, so a Redis that answers reads 1 before any request, each use on its own client."""
    gw = GatewayProcess(gateway_config(redis_proc.url, "closed"), tmp_path).start()
    try:
        assert {series: gauge(gw, series) for series in REDIS_GAUGES} == dict.fromkeys(REDIS_GAUGES, 1.0)
    finally:
        gw.stop()
