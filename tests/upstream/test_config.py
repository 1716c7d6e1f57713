"""Parsing an upstream's configuration section."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from bastion.errors import ConfigError
from bastion.upstream.config import UpstreamConfig, build_upstream
from bastion.upstream.http_auto import AutoHttpUpstream
from bastion.upstream.http_sse import SseUpstream
from bastion.upstream.stderr import StderrLimits
from bastion.upstream.stdio import StdioUpstream

ENV = {"TOKEN": "s3cret", "HOST": "example.test"}


def parse(data: dict[str, Any], name: str = "files") -> UpstreamConfig:
    return UpstreamConfig.from_mapping(name, data, "upstreams", environ=ENV)


def test_stdio_section() -> None:
    cfg = parse({"command": ["python", "-m", "x"], "env": {"K": "${TOKEN}"}, "cwd": ".", "timeout": "500ms"})
    assert cfg.transport == "stdio"
    assert cfg.command == ("python", "-m", "x")
    assert cfg.env == {"K": "s3cret"}
    assert cfg.cwd == "."
    assert cfg.timeout == 0.5
    assert cfg.max_timeout == 300
    assert cfg.prefix == "files"
    assert cfg.enabled is True
    assert cfg.era == "auto"
    assert parse({"command": ["x"], "era": "modern"}).era == "modern"


def test_http_section() -> None:
    cfg = parse({"url": "https://${HOST}/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}, "prefix": "gh",
                 "timeout": "2m", "max_timeout": 600, "enabled": False}, name="github")
    assert cfg.transport == "streamable-http"
    assert cfg.url == "https://example.test/mcp"
    assert cfg.headers == {"Authorization": "Bearer s3cret"}
    assert (cfg.prefix, cfg.timeout, cfg.max_timeout, cfg.enabled) == ("gh", 120, 600, False)


@pytest.mark.parametrize("prefix", [None, ""])
def test_prefix_can_be_turned_off(prefix: str | None) -> None:
    assert parse({"command": ["x"], "prefix": prefix}).prefix is None


@pytest.mark.parametrize(("data", "path", "text"), [
    ({"command": ["x"], "colour": "red"}, "upstreams.files.colour", "unknown key"),
    ({"command": ["x"], "url": "http://a"}, "upstreams.files", "exactly one"),
    ({}, "upstreams.files", "exactly one"),
    ({"command": []}, "upstreams.files.command", "non-empty"),
    ({"command": ["x"], "headers": {}}, "upstreams.files.headers", "unknown key"),
    ({"command": ["x"], "env": {"A": "${MISSING}"}}, "upstreams.files.env.A", "MISSING is not set"),
    ({"url": "http://a", "headers": {"X": "${NOPE}"}}, "upstreams.files.headers.X", "NOPE is not set"),
    ({"url": "ftp://a"}, "upstreams.files.url", "http"),
    ({"url": "http://a", "transport": "websocket"}, "upstreams.files.transport", "streamable-http"),
    ({"command": ["x"], "timeout": "soon"}, "upstreams.files.timeout", "duration"),
    ({"command": ["x"], "timeout": "10m"}, "upstreams.files.timeout", "max_timeout"),
    ({"command": ["x"], "prefix": "Bad_Prefix"}, "upstreams.files.prefix", "prefix"),
    ({"command": ["x"], "enabled": "yes"}, "upstreams.files.enabled", "true or false"),
    ({"command": ["x"], "era": "2026"}, "upstreams.files.era", "'auto', 'legacy' or 'modern'"),
    ({"url": "http://a", "transport": "sse", "era": "modern"}, "upstreams.files.era", "handshake-era only"),
    ({"url": "http://a", "stderr": {}}, "upstreams.files.stderr", "unknown key"),
    ({"command": ["x"], "stderr": "quiet"}, "upstreams.files.stderr", "mapping"),
    ({"command": ["x"], "stderr": {"lines": 3}}, "upstreams.files.stderr.lines", "unknown key"),
    ({"command": ["x"], "stderr": {"max_line_size": "10B"}}, "upstreams.files.stderr.max_line_size", "between"),
    ({"command": ["x"], "stderr": {"burst": 0}}, "upstreams.files.stderr.burst", "whole number"),
    ({"command": ["x"], "stderr": {"burst": True}}, "upstreams.files.stderr.burst", "whole number"),
    ({"command": ["x"], "stderr": {"per_second": 0}}, "upstreams.files.stderr.per_second", "above 0"),
])
def test_errors_name_the_key(data: dict[str, Any], path: str, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(data)
    assert info.value.path == path
    assert text in info.value.message


def test_stderr_limits() -> None:
    assert parse({"command": ["x"]}).stderr == StderrLimits(max_line_bytes=4096, burst=100, per_second=10.0)
    cfg = parse({"command": ["x"], "stderr": {"max_line_size": "16KiB", "burst": 500, "per_second": 0.5}})
    assert cfg.stderr == StderrLimits(max_line_bytes=16384, burst=500, per_second=0.5)


def test_bad_upstream_name() -> None:
    with pytest.raises(ConfigError) as info:
        parse({"command": ["x"]}, name="My Server")
    assert info.value.path == "upstreams.My Server"


async def test_factory_builds_each_transport() -> None:
    async with httpx.AsyncClient() as client:
        assert isinstance(build_upstream(parse({"command": ["x"]}), client), StdioUpstream)
        http = build_upstream(parse({"url": "http://a/mcp", "era": "auto"}), client)
        assert isinstance(http, AutoHttpUpstream)
        assert http.era is None
        pinned = build_upstream(parse({"url": "http://a/mcp", "era": "modern"}), client)
        assert isinstance(pinned, AutoHttpUpstream)
        assert pinned.era == "modern"
        assert isinstance(build_upstream(parse({"url": "http://a/sse", "transport": "sse"}), client), SseUpstream)


async def test_max_server_requests_reaches_every_transports_connection() -> None:
    """An upstream's ``max_server_requests`` bounds the connection of whichever transport it is built with (and
    refusals go to the one ``on_refused``); without it, the default."""
    def hook(upstream: str, reason: str) -> None:
        return None

    async with httpx.AsyncClient() as client:
        stdio = build_upstream(parse({"command": ["x"], "max_server_requests": 128}), client, on_refused=hook)
        auto = build_upstream(parse({"url": "http://a/mcp", "max_server_requests": 7}), client, on_refused=hook)
        sse = build_upstream(parse({"url": "http://a/sse", "transport": "sse", "max_server_requests": 9}), client,
                             on_refused=hook)
        plain = build_upstream(parse({"command": ["x"]}), client)
        assert isinstance(stdio, StdioUpstream) and isinstance(auto, AutoHttpUpstream)
        assert isinstance(sse, SseUpstream) and isinstance(plain, StdioUpstream)
        sessions = [(stdio._rpc, 128), (auto._modern._rpc, 7), (auto._handshake._rpc, 7), (sse._rpc, 9),
                    (plain._rpc, 32)]
        for rpc, bound in sessions:
            assert rpc._max_serving == bound
        assert all(rpc._on_refused is hook for rpc, _ in sessions[:-1])
