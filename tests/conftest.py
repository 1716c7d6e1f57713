from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real Redis for the whole run. Tests must namespace their keys (or flush their own db)."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A Redis of this test's own, for tests that kill and restart it."""
    server = RedisServer().start()
    yield server
    server.stop()
