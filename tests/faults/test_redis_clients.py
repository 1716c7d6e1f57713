"""The Redis client factory against a real redis-server killed (SIGKILL) and restarted on the same port.

What the factory's options buy, checked against the installed redis-py: after a restart every pooled connection is
dead, and none of them may cost a failed command; while Redis is down a command fails fast instead of looping.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from bastion.ratelimit.config import RateLimitConfig
from bastion.redisconn import ADMIN, SHARED, ClientOptions, RedisClients, limiter_options, open_client
from tests.support.redis_server import RedisServer

POOLED = 16


async def fill_pool(client: aioredis.Redis) -> None:
    """Open ``POOLED`` connections at once (each BLPOP holds one for 50 ms), then return them to the pool."""
    await asyncio.gather(*(client.blpop(["faults:nothing"], timeout=0.05) for _ in range(POOLED)))


@pytest.mark.parametrize("options", [SHARED, ADMIN, limiter_options(0.25)], ids=["shared", "admin", "limiter"])
async def test_no_command_fails_on_the_stale_connections_a_restart_leaves(private_redis: RedisServer,
                                                                          options: ClientOptions) -> None:
    client = open_client(private_redis.url, options)
    try:
        await fill_pool(client)
        private_redis.kill()
        private_redis.start()
        # Every pooled connection is dead now; each concurrent command takes one of them.
        results = await asyncio.wait_for(
            asyncio.gather(*(client.incr("faults:n") for _ in range(POOLED)), return_exceptions=True), 10)
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert sorted(results) == list(range(1, POOLED + 1))  # type: ignore[type-var]
    finally:
        await client.aclose()


async def test_without_the_factory_a_restart_fails_one_command_per_stale_connection(
        private_redis: RedisServer) -> None:
    """The defect the factory removes, shown on the installed redis-py: ``from_url`` alone retries nothing."""
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        await fill_pool(client)
        private_redis.kill()
        private_redis.start()
        results = await asyncio.gather(*(client.incr("faults:n") for _ in range(POOLED)), return_exceptions=True)
        assert sum(isinstance(r, RedisConnectionError) for r in results) >= POOLED - 1
    finally:
        await client.aclose()


@pytest.mark.parametrize("options", [SHARED, limiter_options(0.25)], ids=["shared", "limiter"])
async def test_a_command_fails_fast_while_redis_is_down(private_redis: RedisServer, options: ClientOptions) -> None:
    client = open_client(private_redis.url, options)
    try:
        await fill_pool(client)
        private_redis.kill()
        started = time.monotonic()
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(client.incr("faults:n"), 10)
        # Connection refused twice (the one retry), no backoff loop: redis-py's constructor default took 2-4 s.
        assert time.monotonic() - started < 0.5
    finally:
        await client.aclose()


async def test_the_gateway_clients_are_separate_pools_with_the_limiter_timeout(redis_server: RedisServer) -> None:
    clients = RedisClients.open(redis_server.url, limiter_timeout_s=0.05)
    try:
        assert clients.shared.connection_pool is not clients.limiter.connection_pool
        limiter_kwargs = clients.limiter.connection_pool.connection_kwargs
        assert limiter_kwargs["socket_timeout"] == limiter_kwargs["socket_connect_timeout"] == 0.05
        assert clients.shared.connection_pool.connection_kwargs["socket_timeout"] == SHARED.socket_timeout_s
        for client in (clients.shared, clients.limiter):
            assert client.connection_pool.connection_kwargs["retry"].get_retries() == 1
            assert await client.ping()
    finally:
        await clients.aclose()
    assert RateLimitConfig(timeout_s=0.05).redis_client_kwargs()["socket_timeout"] == 0.05
