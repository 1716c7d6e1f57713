from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tests.support.redis_server import RedisServer


@pytest.fixture
def prefix() -> str:
    """A key namespace of the test's own on the shared Redis."""
    return f"test:{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url, socket_timeout=5, socket_connect_timeout=5)
    yield client
    await client.aclose()
