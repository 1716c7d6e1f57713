"""Redis round trips per tools/call through a real gateway, counted by Redis itself (``INFO commandstats``).

With Redis sessions and Redis limits a call used to make two: the session's ``GETEX``, then the limiter's
``EVALSHA``. With the session cache (``sessions.cache``, on by default) the hot path makes one; the session's
``GETEX`` comes only with the write-behind touch, one pipeline per 100 ms whatever the number of calls.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import RpcClient

CALLS = 100


def _calls(client: redis.Redis, command: str) -> int:
    entry = client.info("commandstats").get(f"cmdstat_{command}")
    return int(entry["calls"]) if entry else 0


@pytest.mark.parametrize(("cache", "getex_at_most"), [("1s", CALLS // 5), (0, CALLS)])
def test_round_trips_per_call(tmp_path: Path, private_redis: RedisServer, cache: str | int,
                              getex_at_most: int) -> None:
    config = {"auth": "none", "redis": {"url": private_redis.url}, "sessions": {"cache": cache},
              "upstreams": {"basic": stdio_upstream()},
              "rate_limits": {"timeout": "3s",
                              "defaults": [{"name": "p", "rate": "100000/hour", "burst": 1000, "per": "principal"}]}}
    gw = GatewayProcess(config, tmp_path).start()
    r = redis.Redis.from_url(private_redis.url)
    client = RpcClient(gw.url)
    try:
        client.initialize()
        client.call("basic__echo", {"message": "warm"})  # scripts loaded, session known
        getex, evalsha = _calls(r, "getex"), _calls(r, "evalsha")
        for i in range(CALLS):
            assert client.call("basic__echo", {"message": str(i)})["result"]["content"][0]["text"] == str(i)
        getex, evalsha = _calls(r, "getex") - getex, _calls(r, "evalsha") - evalsha
        assert evalsha == CALLS  # the limiter: one script per call, either way
        if cache:
            assert getex <= getex_at_most  # only the write-behind touches (about one per 100 ms)
        else:
            assert getex == CALLS  # the session looked up in Redis on every call: two round trips per call
    finally:
        client.close()
        r.close()
        gw.stop()
