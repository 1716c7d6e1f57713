"""The three Redis shapes as configuration: settings to URL, URL to target, and the errors for bad ones."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.errors import ConfigError
from bastion.redisconn import parse_target
from bastion.settings import _redis_url


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
