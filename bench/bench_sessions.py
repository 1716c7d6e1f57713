"""What the session lookup plus the rate-limit check cost per call with Redis, for the ways of doing them.

    python bench/bench_sessions.py                      # starts its own redis-server on a free loopback port
    python bench/bench_sessions.py --n 20000 --concurrency 32 --sessions 32

Scenarios, each ``--n`` calls over ``--concurrency`` tasks spread over ``--sessions`` sessions:

- ``two-trips``: the store without the cache (``GETEX`` per call), then the limiter's script: two round trips;
- ``one-script``: a prototype that does both in one script (``GETEX`` and the GCRA step in one ``EVALSHA``); not
  what bastion ships (see below), here to price the alternative;
- ``cached``: ``CachedSessionStore`` in front of the store (sessions confirmed within ``trust_s`` are served from
  memory, touches written behind in one pipeline per ``touch_delay_s``), then the limiter's script.

Prints per call: this process's CPU (the gateway's share), Redis's CPU (from its ``INFO cpu``), the round trips to
Redis (packed sends on the client's connections: a pipeline is one) and the calls per second.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from bastion.ratelimit.gcra import RateCheck
from bastion.ratelimit.model import Rate, RateLimitSpec
from bastion.ratelimit.redis_limiter import RedisLimiter
from bastion.sessions.cache import CachedSessionStore
from bastion.sessions.fallback import FallbackSessionStore
from bastion.sessions.redis_store import RedisSessionStore
from bastion.sessions.store import SessionData, new_session_id

# The one-script alternative: the session's GETEX and a one-bucket GCRA step in one call. A prototype for pricing
# only: it needs the session key and the buckets in one Cluster slot, and the lookup moved to the limiter step.
ONE_SCRIPT = """
local raw = redis.call('GETEX', KEYS[1], 'PX', ARGV[1])
if not raw then return {false} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local emission, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[2]) or '') or now
if tat < now then tat = now end
local new_tat = tat + emission
if new_tat - emission * burst > now then return {raw, 0} end
redis.call('SET', KEYS[2], string.format('%d', new_tat), 'PX', math.max(1, math.ceil((new_tat - now) / 1000)))
return {raw, 1}
"""

Call = Callable[[str], Awaitable[Any]]


@contextmanager
def redis_server() -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                 "no", "--dir", work], stdout=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait()


class CountingConnection(Connection):
    """Counts round trips: one per packed send (a pipeline sends all its commands at once)."""

    sends = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        await super().send_packed_command(command, check_health)


async def redis_usage(client: Redis) -> tuple[float, int]:
    cpu = await client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), CountingConnection.sends


async def measure(client: Redis, call: Call, sids: list[str], n: int, concurrency: int) -> dict[str, float]:
    async def worker(k: int, count: int) -> None:
        sid = sids[k % len(sids)]
        for _ in range(count):
            await call(sid)

    await asyncio.gather(*(worker(k, 50) for k in range(concurrency)))  # warm-up
    share = n // concurrency
    redis_cpu0, commands0 = await redis_usage(client)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(k, share) for k in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    redis_cpu1, commands1 = await redis_usage(client)
    done = share * concurrency
    return {"cpu_us": cpu / done * 1e6, "redis_us": (redis_cpu1 - redis_cpu0) / done * 1e6,
            "commands": (commands1 - commands0 - 1) / done, "rate": done / wall}


async def run(url: str, n: int, concurrency: int, sessions: int) -> None:
    client = Redis.from_url(url, socket_timeout=5, max_connections=concurrency + 8,
                            connection_class=CountingConnection)
    ns = uuid.uuid4().hex[:8]
    prefix = f"bench:{ns}:session:"
    idle = 3600.0
    redis_store = RedisSessionStore(client, idle_timeout_s=idle, key_prefix=prefix)
    plain = FallbackSessionStore(redis_store, idle_timeout_s=idle, max_sessions=10_000)
    cached = CachedSessionStore(FallbackSessionStore(redis_store, idle_timeout_s=idle, max_sessions=10_000),
                                idle_timeout_s=idle, max_sessions=10_000)
    limiter = RedisLimiter(client, key_prefix=f"bench:{ns}:rl", timeout_s=1.0)
    spec = RateLimitSpec(name="per-principal", scope="principal", rate=Rate(10**9, 3600.0))
    checks = [RateCheck.from_spec(spec, f"per-principal:{ns}")]
    sids = []
    for _ in range(sessions):
        data = SessionData(id=new_session_id(), principal_id="alice", protocol_version="2025-06-18",
                           client_info={"name": "bench", "version": "1"}, created_at=time.time())
        await plain.create(data)
        sids.append(data.id)
    one_sha = hashlib.sha1(ONE_SCRIPT.encode(), usedforsecurity=False).hexdigest()
    await client.script_load(ONE_SCRIPT)
    rl_key = f"bench:{ns}:one"
    ttl_ms = int(idle * 1000)

    async def two_trips(sid: str) -> None:
        assert await plain.get(sid) is not None
        (await limiter.check(checks)).raise_if_refused()

    async def one_script(sid: str) -> None:
        raw, allowed = await client.evalsha(one_sha, 2, prefix + sid, rl_key, ttl_ms, 1, 10**9)
        assert raw
        assert allowed
        SessionData.from_json(raw)

    async def with_cache(sid: str) -> None:
        assert await cached.get(sid) is not None
        (await limiter.check(checks)).raise_if_refused()

    print(f"c={concurrency} sessions={sessions} n={n}")
    print(f"{'scenario':<12} {'CPU us/call':>11} {'Redis us/call':>13} {'trips/call':>10} {'calls/s':>8}")
    for name, call in (("two-trips", two_trips), ("one-script", one_script), ("cached", with_cache)):
        r = await measure(client, call, sids, n, concurrency)
        print(f"{name:<12} {r['cpu_us']:>11.1f} {r['redis_us']:>13.1f} {r['commands']:>10.3f} {r['rate']:>8.0f}")
    await cached.aclose()
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", help="an existing Redis (default: start one)")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, action="append", help="repeatable (default: 1 and 32)")
    parser.add_argument("--sessions", type=int, default=0, help="sessions (default: one per task)")
    args = parser.parse_args()
    levels = args.concurrency or [1, 32]

    def go(url: str) -> None:
        for c in levels:
            asyncio.run(run(url, args.n, c, args.sessions or c))

    if args.redis_url:
        go(args.redis_url)
    else:
        with redis_server() as url:
            go(url)


if __name__ == "__main__":
    main()
