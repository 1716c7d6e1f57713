"""The three Redis shapes as configuration: settings to URL, URL to target, and the errors for bad ones."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError

from bastion.errors import ConfigError
from bastion.redisconn import SHARED, open_client, parse_target
from bastion.settings import _redis_url
from tests.support.redis_server import RedisServer


def test_sentinel_mapping_becomes_a_url_with_every_secret_intact() -> None:
    url = _redis_url({"sentinel": {"master": "prod", "nodes": ["s1:26379", "s2:26379"], "db": 3,
                                   "username": "gw", "password": "p@ss:w/rd", "sentinel_password": "s&x y"}}, {})
    target = parse_target(url or "")
    assert (target.kind, target.master, target.db, target.nodes) == ("sentinel", "prod", 3,
                                                                      (("s1", 26379), ("s2", 26379)))
    assert (target.username, target.password, target.sentinel_password) == ("gw", "p@ss:w/rd", "s&x y")


def test_cluster_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE", "n1")
    monkeypatch.setenv("PW", "secret")
    target = parse_target(_redis_url({"cluster": {"nodes": ["${NODE}:7000", "n2:7001"], "password": "${PW}"}},
                                     {}) or "")
    assert (target.kind, target.nodes, target.password) == ("cluster", (("n1", 7000), ("n2", 7001)), "secret")


def test_env_url_takes_every_shape() -> None:
    url = "redis+cluster://a:1,b:2"
    assert _redis_url({"url": "redis://x:1/0"}, {"BASTION_REDIS_URL": url}) == url


@pytest.mark.parametrize(("value", "path", "message"), [
    ({"url": "redis://x", "cluster": {"nodes": ["a:1"]}}, "redis", "exactly one"),
    ({}, "redis", "exactly one"),
    ({"cluster": {"nodes": []}}, "redis.cluster.nodes", "non-empty list"),
    ({"cluster": {"nodes": ["a"]}}, "redis.cluster", "host:port"),
    ({"cluster": {"nodes": ["a:99999"]}}, "redis.cluster", "host:port"),
    ({"cluster": {"nodes": ["a:1"], "db": 1}}, "redis.cluster.db", "unknown"),
    ({"sentinel": {"nodes": ["a:1"]}}, "redis.sentinel.master", "non-empty string"),
    ({"sentinel": {"master": "m", "nodes": ["a:1"], "db": -1}}, "redis.sentinel.db", "non-negative"),
    ({"url": "http://x"}, "redis.url", "redis+sentinel://"),
])
def test_bad_redis_settings_name_their_key(value: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _redis_url(value, {})
    assert err.value.path == path
    assert message in str(err.value)


@pytest.mark.parametrize("url", ["redis+sentinel://a:1", "redis+sentinel://a:1/m/x", "redis+cluster://a:1/0",
                                 "redis+cluster://secret@:1"])
def test_bad_urls_are_refused_without_echoing_credentials(url: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_target(url)
    assert "secret" not in str(err.value)


def test_a_connection_closed_under_a_command_is_a_connection_error_on_uvloop(private_redis: RedisServer) -> None:
    """Under uvloop (the gateway's loop), redis-py writing on a connection whose transport is already closed (a
    Sentinel failover, a primary killed under load) raised uvloop's RuntimeError, which no Redis error handling
    in bastion expects: a lease release ended its call as an internal error. The clients map it to
    ConnectionError, for commands and pipelines, and the next command connects afresh."""
    async def scenario() -> list[str]:
        seen: list[str] = []
        client = open_client(private_redis.url, SHARED)
        try:
            for use in ("command", "pipeline"):
                await client.ping()
                pooled = client.connection_pool._available_connections[0]  # type: ignore[attr-defined]
                pooled._writer.transport.close()  # the socket goes; redis-py's objects stay as they were
                await asyncio.sleep(0.05)
                try:
                    if use == "command":
                        await client.ping()
                    else:
                        pipe = client.pipeline(transaction=False)
                        pipe.ping()
                        await pipe.execute()
                except RedisConnectionError:
                    seen.append(f"{use}: ConnectionError")
                assert await client.ping() is True
        finally:
            await client.aclose()
        return seen

    assert uvloop.run(scenario()) == ["command: ConnectionError", "pipeline: ConnectionError"]
