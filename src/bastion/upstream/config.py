"""One upstream's configuration section, parsed from a plain mapping, and the factory that builds it.

    upstreams:
      files:  {command: [python, -m, files_server], env: {ROOT: /srv}, cwd: ., timeout: 30s}
      github: {url: "https://host/mcp", headers: {Authorization: "Bearer ${GITHUB_TOKEN}"}, prefix: gh}
      legacy: {url: "https://old/mcp", era: legacy}   # skip era detection: auto (default), legacy or modern
      plain:  {url: "http://10.0.0.5/mcp", http_client: httpx}  # POST through httpx instead of the lean pool
      big:    {url: "https://big/mcp", max_message_size: 256MiB}  # one message, once decoded (default 64 MiB)
      agent:  {command: [agent], max_server_requests: 128}  # its requests served at once (default 32)

Upstream credentials come only from here (``${VAR}`` is expanded from the environment at load time), never from
clients, so a client's token can never reach an upstream.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from bastion.errors import ConfigError
from bastion.units import parse_duration, parse_size
from bastion.upstream.base import EraSetting, Upstream
from bastion.upstream.bodies import DEFAULT_MAX_MESSAGE_BYTES
from bastion.upstream.connections import H1Pool, eligible
from bastion.upstream.http_auto import AutoHttpUpstream
from bastion.upstream.http_sse import SseUpstream
from bastion.upstream.session import MAX_SERVING, RefusalHandler, ServerRequests, StrayHandler
from bastion.upstream.stderr import DEFAULT_STDERR, StderrHook, StderrLimits
from bastion.upstream.stdio import StdioUpstream
from bastion.yamlfile import expand_env

__all__ = ["DEFAULT_ERA", "UpstreamConfig", "build_upstream"]

Transport = Literal["stdio", "streamable-http", "sse"]
# "fast": Streamable HTTP POSTs go through ``connections`` (when the URL allows, see ``connections.eligible``); "httpx":
# everything goes through the shared httpx client, the escape hatch should an upstream need what only httpx does.
HttpClientSetting = Literal["fast", "httpx"]

_COMMON = {"prefix", "timeout", "max_timeout", "enabled", "era", "max_message_size", "max_server_requests"}
# Requests one upstream connection may have bastion serve at once: each holds a task and, relayed, a client's
# attention; beyond this, an upstream is flooding rather than working.
MAX_SERVER_REQUESTS_CEILING = 4096
_ERAS = ("auto", "legacy", "modern")
# Detect, as the specification asks of dual-era clients. A server that answers server/discover but speaks the
# handshake era's shapes (the SDK's low-level Server with plain-dict handlers does) needs `era: legacy`.
DEFAULT_ERA: EraSetting = "auto"
_STDIO = _COMMON | {"command", "env", "cwd", "stderr"}
_STDERR = frozenset({"max_line_size", "burst", "per_second"})
_HTTP = _COMMON | {"url", "transport", "headers", "http_client"}
# Names stay inside SEP-986's tool-name alphabet once joined as "<prefix>__<tool>".
_PREFIX = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")


def _expand(value: Any, path: str, environ: Mapping[str, str]) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ConfigError("expected a string", path=path)
    return expand_env(str(value), path, environ)


def _string_map(value: Any, path: str, environ: Mapping[str, str]) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("expected a mapping of names to strings", path=path)
    return {str(k): _expand(v, f"{path}.{k}", environ) for k, v in value.items()}


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    name: str
    transport: Transport
    prefix: str | None
    timeout: float = 30.0
    max_timeout: float = 300.0
    enabled: bool = True
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    era: EraSetting = DEFAULT_ERA
    http_client: HttpClientSetting = "fast"
    # One message from the upstream, on every transport: a stdio line, an HTTP body or SSE event once decoded.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # Requests from the upstream (sampling, elicitation, roots/list, ping) served or relayed at once per connection.
    max_server_requests: int = MAX_SERVING
    stderr: StderrLimits = DEFAULT_STDERR

    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, Any], path: str = "upstreams",
                     environ: Mapping[str, str] | None = None) -> UpstreamConfig:
        """``path`` is the parent key path; errors name ``<path>.<name>.<key>``."""
        env = os.environ if environ is None else environ
        here = f"{path}.{name}"
        if not _PREFIX.match(name):
            raise ConfigError("upstream names are 1-32 characters of a-z, 0-9 and '-'", path=here)
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", path=here)
        # Unknown keys first: a misspelt ``comand`` must be named, not reported as "no command or url".
        for key in data:
            if key not in _STDIO | _HTTP:
                close = difflib.get_close_matches(str(key), sorted(_STDIO | _HTTP), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown key {key!r}{hint}", path=f"{here}.{key}")
        if ("command" in data) == ("url" in data):
            raise ConfigError("set exactly one of 'command' (stdio) or 'url' (HTTP)", path=here)
        allowed = _STDIO if "command" in data else _HTTP
        for key in data:
            if key not in allowed:
                kind = "a stdio upstream (command)" if "command" in data else "an HTTP upstream (url)"
                raise ConfigError(f"unknown key {key!r} for {kind}", path=f"{here}.{key}")

        prefix: str | None = name
        if "prefix" in data:
            raw = data["prefix"]
            if raw is None or raw == "":
                prefix = None
            elif isinstance(raw, str) and _PREFIX.match(raw):
                prefix = raw
            else:
                raise ConfigError("prefix must be null, empty, or 1-32 characters of a-z, 0-9 and '-'",
                                  path=f"{here}.prefix")
        timeout = parse_duration(data.get("timeout", 30), f"{here}.timeout")
        max_timeout = parse_duration(data.get("max_timeout", 300), f"{here}.max_timeout")
        if timeout > max_timeout:
            raise ConfigError("timeout must not exceed max_timeout", path=f"{here}.timeout")
        enabled = data.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError("expected true or false", path=f"{here}.enabled")
        era = data.get("era", DEFAULT_ERA)
        if era not in _ERAS:
            raise ConfigError("era must be 'auto', 'legacy' or 'modern'", path=f"{here}.era")
        max_message = parse_size(data.get("max_message_size", DEFAULT_MAX_MESSAGE_BYTES), f"{here}.max_message_size")
        serving = data.get("max_server_requests", MAX_SERVING)
        if not isinstance(serving, int) or isinstance(serving, bool) or not 1 <= serving <= MAX_SERVER_REQUESTS_CEILING:
            raise ConfigError(f"max_server_requests must be a whole number from 1 to {MAX_SERVER_REQUESTS_CEILING}",
                              path=f"{here}.max_server_requests")
        common: dict[str, Any] = {"name": name, "prefix": prefix, "timeout": timeout, "max_timeout": max_timeout,
                                  "enabled": enabled, "era": era, "max_message_bytes": max_message,
                                  "max_server_requests": serving}

        if "command" in data:
            command = data["command"]
            if (not isinstance(command, list) or not command
                    or not all(isinstance(c, str | int | float) and not isinstance(c, bool) for c in command)):
                raise ConfigError("command must be a non-empty list of strings", path=f"{here}.command")
            cwd = data.get("cwd")
            if cwd is not None and not isinstance(cwd, str):
                raise ConfigError("cwd must be a string", path=f"{here}.cwd")
            return cls(transport="stdio", command=tuple(str(c) for c in command),
                       env=_string_map(data.get("env"), f"{here}.env", env), cwd=cwd,
                       stderr=_stderr(data.get("stderr"), f"{here}.stderr"), **common)

        url = _expand(data["url"], f"{here}.url", env)
        if not url.startswith(("http://", "https://")):
            raise ConfigError("url must be an http:// or https:// URL", path=f"{here}.url")
        transport = data.get("transport", "streamable-http")
        if transport not in ("streamable-http", "sse"):
            raise ConfigError("transport must be 'streamable-http' or 'sse'", path=f"{here}.transport")
        if transport == "sse" and era == "modern":
            raise ConfigError("the sse transport is handshake-era only; use era 'legacy' or 'auto'", path=f"{here}.era")
        http_client = data.get("http_client", "fast")
        if http_client not in ("fast", "httpx"):
            raise ConfigError("http_client must be 'fast' or 'httpx'", path=f"{here}.http_client")
        return cls(transport=transport, url=url, headers=_string_map(data.get("headers"), f"{here}.headers", env),
                   http_client=http_client, **common)


def _stderr(data: Any, path: str) -> StderrLimits:
    """A stdio upstream's ``stderr``: how long a line may be and how many lines per second reach the log."""
    if data is None:
        return DEFAULT_STDERR
    if not isinstance(data, Mapping):
        raise ConfigError("expected a mapping with max_line_size, burst, per_second", path=path)
    for key in data:
        if key not in _STDERR:
            raise ConfigError(f"unknown key {key!r} (expected max_line_size, burst, per_second)", path=f"{path}.{key}")
    default = DEFAULT_STDERR
    line = parse_size(data.get("max_line_size", default.max_line_bytes), f"{path}.max_line_size")
    if not 80 <= line <= 1024 * 1024:
        raise ConfigError("max_line_size must be between 80 bytes and 1MiB", path=f"{path}.max_line_size")
    burst = data.get("burst", default.burst)
    if not isinstance(burst, int) or isinstance(burst, bool) or not 1 <= burst <= 1_000_000:
        raise ConfigError("burst must be a whole number of lines from 1 to 1000000", path=f"{path}.burst")
    rate = data.get("per_second", default.per_second)
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 < rate <= 1_000_000:
        raise ConfigError("per_second must be a number of lines above 0, at most 1000000",
                          path=f"{path}.per_second")
    return StderrLimits(max_line_bytes=line, burst=burst, per_second=float(rate))


def build_upstream(cfg: UpstreamConfig, http_client: httpx.AsyncClient, *,
                   on_stray: StrayHandler | None = None, on_stderr: StderrHook | None = None,
                   on_refused: RefusalHandler | None = None) -> Upstream:
    """``on_stray(upstream, reason)`` hears of every response dropped because it answered no request of its stream
    (see ``bastion.upstream.session``), ``on_refused(upstream, reason)`` of every request from the upstream refused
    (``session.REFUSAL_REASONS``), ``on_stderr(upstream, outcome, lines)`` of a stdio child's stderr lines
    (``bastion.upstream.stderr``); the app counts them all."""
    requests = ServerRequests(max_serving=cfg.max_server_requests, on_refused=on_refused)
    if cfg.transport == "stdio":
        return StdioUpstream(cfg.name, cfg.command, cfg.env, cfg.cwd, era=cfg.era, on_stray=on_stray,
                             server_requests=requests, max_message_bytes=cfg.max_message_bytes, stderr=cfg.stderr,
                             on_stderr=on_stderr)
    assert cfg.url is not None
    if cfg.transport == "sse":
        return SseUpstream(cfg.name, cfg.url, cfg.headers, http_client, on_stray=on_stray, server_requests=requests,
                           max_message_bytes=cfg.max_message_bytes)
    fast = H1Pool(cfg.name) if cfg.http_client == "fast" and eligible(cfg.url) else None
    return AutoHttpUpstream(cfg.name, cfg.url, cfg.headers, http_client, era=cfg.era, fast=fast, on_stray=on_stray,
                            server_requests=requests, max_message_bytes=cfg.max_message_bytes)
