"""Scale-out on paper: Redis's own counters, read from a real Redis, and the derivation from them."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from tests.support.redis_server import RedisServer


def result(calls: int, proxy_s: float, counters: dict[str, float], redis_proc_s: float | None = None) -> Any:
    """A measured run, as ``loadgen.run_load`` returns it (``Any``: bench/ is importable only inside a test)."""
    from loadgen import Result

    cpu = {"proxy": proxy_s, **({"redis": redis_proc_s} if redis_proc_s is not None else {})}
    return Result(label="bastion full", calls=calls, errors=0, elapsed=1.0, latencies_ms=[1.0] * calls, cpu_s=cpu,
                  loadgen_cpu_s=0.0, counters=counters)


def test_the_redis_probe_counts_commands_and_cpu_of_a_real_redis(bench_modules: None,
                                                                  redis_server: RedisServer) -> None:
    from loadgen import increase
    from scaleout import redis_probe

    client = Redis.from_url(redis_server.url)
    try:
        probe = redis_probe(client)
        before = probe()
        for i in range(50):
            client.set(f"bench-scaleout:{i}", i)
        client.get("bench-scaleout:0")
        after = probe()
    finally:
        client.delete(*(f"bench-scaleout:{i}" for i in range(50)))
        client.close()
    grown = increase(before, after)
    assert grown["calls.set"] == 50
    assert grown["calls.get"] == 1
    assert grown["usec.set"] > 0
    assert grown["cpu_s"] >= 0  # microsecond resolution; 51 commands may cost less than the clock shows
    assert after["cpu_s"] > 0


def test_increase_treats_a_counter_new_in_the_window_as_starting_at_zero(bench_modules: None) -> None:
    from loadgen import increase

    assert increase({"a": 5.0}, {"a": 7.5, "b": 3.0}) == {"a": 2.5, "b": 3.0}


def test_merge_pools_counters_over_the_rounds(bench_modules: None) -> None:
    from loadgen import merge

    pooled, = merge([result(10, 0.01, {"redis:cpu_s": 0.001, "redis:calls.get": 10.0}),
                     result(30, 0.02, {"redis:cpu_s": 0.002, "redis:calls.evalsha": 30.0})])
    assert pooled.calls == 40
    assert pooled.counters == pytest.approx({"redis:cpu_s": 0.003, "redis:calls.get": 10.0,
                                             "redis:calls.evalsha": 30.0})
    assert pooled.per_call("redis:calls.evalsha") == pytest.approx(0.75)


def test_replicas_per_redis_follow_from_the_two_costs_and_the_headroom(bench_modules: None) -> None:
    from scaleout import ScaleOut, section

    # 1,000 calls: bastion 0.5 s of CPU (0.5 ms/call), Redis 0.05 s by its own count (0.05 ms/call), 4 commands per
    # call, and two INFO readings of the probe's own that must not count as the gateway's.
    counters = {"redis:cpu_s": 0.05, "redis:calls.evalsha": 1000.0, "redis:calls.get": 1000.0,
                "redis:calls.set": 1000.0, "redis:calls.time": 1000.0, "redis:calls.info": 2.0,
                "redis:usec.evalsha": 20000.0, "redis:usec.get": 1000.0, "redis:usec.info": 500.0}
    row = ScaleOut.of(result(1000, 0.5, counters, redis_proc_s=0.06), 32, 0.7)
    assert row is not None
    assert row.replica_cpu_ms == pytest.approx(0.5)
    assert row.redis_cpu_ms == pytest.approx(0.05)
    assert row.redis_proc_cpu_ms == pytest.approx(0.06)
    assert row.replica_rate == pytest.approx(2000)
    assert row.redis_rate == pytest.approx(20000)
    assert row.replicas == pytest.approx(7.0)  # 0.7 x 20,000 / 2,000
    assert row.commands_per_call == pytest.approx(4.0)
    assert "info" not in row.commands
    assert row.redis_command_ms == pytest.approx(0.021)
    text = section([row], ["Measured with `x`."])
    assert text.startswith("### Scale-out on paper\n\nMeasured with `x`.")
    assert "1000 / 0.500 ms = **2,000 calls/s**" in text
    assert "1000 / 0.0500 ms = **20,000 calls/s**" in text
    assert "0.70 × 20,000 = 14,000 calls/s, ÷ 2,000 per replica = 7.0" in text  # noqa: RUF001
    assert "**one Redis serves 7 single-core replicas**" in text
    assert "`evalsha` 1.00, `get` 1.00, `set` 1.00, `time` 1.00." in text


def test_a_run_without_redis_counters_gives_no_scale_out(bench_modules: None) -> None:
    from scaleout import ScaleOut, section

    assert ScaleOut.of(result(100, 0.05, {}), 1, 0.7) is None
    assert section([], ["header"]) == ""
