"""The gateway configuration: one YAML file plus a few environment overrides, validated whole at load.

This module is the only reader of the config file and of ``BASTION_*`` variables. Each feature module parses its
own section (``XConfig.from_mapping``); this module owns the top level, the core sections, and the rule that an
unknown key anywhere is an error naming the file, the line and the key.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar, overload
from urllib.parse import quote, urlencode

from bastion.admin.config import AdminConfig
from bastion.approvals.config import ApprovalsConfig
from bastion.audit.config import AuditConfig
from bastion.auth.config import AuthConfig
from bastion.backlog import DEFAULT_BACKLOG, MAX_BACKLOG
from bastion.catalogue_limits import CatalogueLimits
from bastion.errors import ConfigError
from bastion.health.config import HealthConfig
from bastion.pinning import PinningConfig
from bastion.ratelimit.config import RateLimitConfig
from bastion.redisconn import parse_target
from bastion.sanitize.config import SanitizeConfig
from bastion.sections import SECTION_NAMES, Core, SectionName, Sections
from bastion.strictjson import DEFAULT_MAX_DEPTH, MAX_CONFIGURABLE_DEPTH
from bastion.tracing.config import TracingConfig
from bastion.units import parse_duration, parse_size
from bastion.upstream.config import UpstreamConfig
from bastion.validation import ValidationConfig
from bastion.yamlfile import YamlDoc, expand_env, load_yaml_file, load_yaml_text

T = TypeVar("T")

DEFAULT_CONFIG_ENV = "BASTION_CONFIG"
# requestState sealing (bastion.server.state): the shared key's variable, its least length, the default lifetime.
STATE_KEY_ENV = "BASTION_STATE_KEY"
MIN_STATE_KEY_BYTES = 32
DEFAULT_STATE_TTL_S = 600.0


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    path: str = "/mcp"
    # Browser origins allowed to call bastion. Loopback origins are always allowed on a loopback listener.
    allowed_origins: tuple[str, ...] = ()
    # Extra Host header values accepted on a loopback listener (DNS-rebinding protection); ignored otherwise.
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = 4 * 1024 * 1024
    # Limits enforced below the ASGI app, in the HTTP protocol (server/protocol.py); defaults as careful edge
    # proxies ship them (Envoy: 100 headers; nginx: 8 KiB request lines; 16 KiB of headers is ample for JWTs).
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100
    max_target_bytes: int = 8 * 1024
    # Headers and body of a request must arrive within this many seconds of its first byte (slowloris).
    request_timeout_s: float = 10.0
    # An idle keep-alive connection is closed after this many seconds.
    keep_alive_timeout_s: float = 5.0
    # http.refused audit records: a token bucket per refusal reason, so a flood cannot fill the disk.
    refusal_audit_burst: int = 20
    refusal_audit_per_minute: int = 12
    # Deepest JSON nesting accepted in a message (the envelope counts: params.arguments start at level 3).
    max_json_depth: int = 64
    # Messages one client stream (a call's SSE response, a GET stream) holds while its client does not read
    # (``bastion.backlog``); past it notifications are coalesced or dropped, and counted.
    client_backlog: int = DEFAULT_BACKLOG

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)


@dataclass(frozen=True, slots=True)
class CatalogueConfig:
    page_size: int = 500
    separator: str = "__"
    on_collision: Literal["first", "reject"] = "first"
    refresh_debounce_s: float = 0.2
    refresh_interval_s: float = 60.0
    # How long a call waits for its upstream's changed definitions to be checked (refresh gate).
    gate_timeout_s: float = 2.0
    limits: CatalogueLimits = field(default_factory=CatalogueLimits)


@dataclass(frozen=True, slots=True)
class StateConfig:
    """The ``requestState`` sealing of the sessions section (see ``bastion.server.state``).

    ``key``: raw bytes (from config or env; ``None`` means a random per-process key). ``ttl_s``: how long a
    client has to answer the input requests and retry."""

    key: bytes | None = field(default=None, repr=False)  # a secret: never in logs or reprs
    ttl_s: float = DEFAULT_STATE_TTL_S

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, path: str = "sessions",
                     environ: Mapping[str, str] | None = None) -> StateConfig:
        """Parse ``state_key`` and ``state_ttl`` (seconds) from the sessions section; other keys are the
        section owner's. ``BASTION_STATE_KEY`` in the environment applies when the file sets no key."""
        data = data or {}
        env = os.environ if environ is None else environ
        raw = data.get("state_key", env.get(STATE_KEY_ENV))
        key: bytes | None = None
        if raw is not None:
            if not isinstance(raw, str) or len(raw.encode("utf-8")) < MIN_STATE_KEY_BYTES:
                raise ConfigError(f"state_key must be a string of at least {MIN_STATE_KEY_BYTES} bytes "
                                  "(e.g. `openssl rand -hex 32`)", path=f"{path}.state_key")
            key = raw.encode("utf-8")
        ttl = data.get("state_ttl", DEFAULT_STATE_TTL_S)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 1 <= ttl <= 86_400:
            raise ConfigError("state_ttl must be a number of seconds between 1 and 86400", path=f"{path}.state_ttl")
        return cls(key=key, ttl_s=float(ttl))


@dataclass(frozen=True, slots=True)
class SessionsConfig:
    idle_timeout_s: float = 3600.0
    max_sessions: int = 10_000
    # Open sessions one principal may hold (memory and Redis stores); past it, that principal's least recently
    # used session ends (``reason: evicted``), so no caller can use up the capacity others need.
    max_per_principal: int = 100
    # How often expired sessions are looked for (each gets its session.end record and leaves the gauge).
    sweep_interval_s: float = 30.0
    # With Redis: how long a replica serves a session Redis confirmed without asking again (sessions/cache.py;
    # also the bound for a DELETE through another replica to take effect here). 0: ask Redis on every request.
    cache_s: float = 1.0
    # requestState sealing for multi round-trip requests (server/state.py); replicas need one shared key.
    state: StateConfig = field(default_factory=StateConfig)


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    format: Literal["console", "json"] = "console"
    level: str = "info"


@dataclass(frozen=True, slots=True)
class Settings:
    source: str
    base_dir: Path
    listen: ListenConfig
    upstreams: tuple[Any, ...]
    sections: Sections
    redis_url: str | None = None
    catalogue: CatalogueConfig = field(default_factory=CatalogueConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    policies: tuple[Path, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)

    # One overload per feature section, so each call site gets that section's own config type.
    @overload
    def section(self, name: Literal["auth"]) -> AuthConfig: ...
    @overload
    def section(self, name: Literal["audit"]) -> AuditConfig: ...
    @overload
    def section(self, name: Literal["rate_limits"]) -> RateLimitConfig: ...
    @overload
    def section(self, name: Literal["validation"]) -> ValidationConfig: ...
    @overload
    def section(self, name: Literal["sanitize"]) -> SanitizeConfig: ...
    @overload
    def section(self, name: Literal["pinning"]) -> PinningConfig: ...
    @overload
    def section(self, name: Literal["health"]) -> HealthConfig: ...
    @overload
    def section(self, name: Literal["admin"]) -> AdminConfig: ...
    @overload
    def section(self, name: Literal["tracing"]) -> TracingConfig: ...
    @overload
    def section(self, name: Literal["approvals"]) -> ApprovalsConfig: ...

    def section(self, name: SectionName) -> object:
        """The parsed feature section ``name`` (its defaults when the file leaves it out)."""
        value: object = getattr(self.sections, name)
        return value


def is_loopback_host(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------------------------
# Small typed readers. They raise ConfigError with the key path; ``load`` adds file and line.


def check_keys(data: Mapping[str, Any], allowed: set[str], path: str) -> None:
    for key in data:
        if key not in allowed:
            where = f"{path}.{key}" if path else key
            hint = ", ".join(sorted(allowed))
            raise ConfigError(f"unknown key {key!r} (allowed: {hint})", path=where)


def as_mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("expected a mapping", path=path)
    return value


def as_str(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError("expected a non-empty string", path=path)
    return value


def as_int(value: Any, path: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"expected an integer >= {minimum}", path=path)
    return value


def as_str_list(value: Any, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError("expected a list of strings", path=path)
    return tuple(value)


# ---------------------------------------------------------------------------------------------------------------
# Sections.

CORE_KEYS = {"listen", "redis", "upstreams", "catalogue", "sessions", "logging", "policies"}


def _listen(data: Mapping[str, Any]) -> ListenConfig:
    check_keys(data, {"host", "port", "path", "allowed_origins", "allowed_hosts", "max_body_size",
                      "max_json_depth", "client_backlog", *_LIMIT_KEYS}, "listen")
    path = data.get("path", "/mcp")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError("must be an absolute URL path such as /mcp", path="listen.path")
    port = as_int(data.get("port", 8080), "listen.port")
    if port > 65535:
        raise ConfigError("port out of range", path="listen.port")
    return ListenConfig(
        host=as_str(data.get("host", "127.0.0.1"), "listen.host"),
        port=port,
        path=path.rstrip("/") or "/",
        allowed_origins=as_str_list(data.get("allowed_origins"), "listen.allowed_origins"),
        allowed_hosts=as_str_list(data.get("allowed_hosts"), "listen.allowed_hosts"),
        max_body_bytes=parse_size(data.get("max_body_size", 4 * 1024 * 1024), "listen.max_body_size"),
        **_listen_limits(data),
        max_json_depth=_json_depth(data.get("max_json_depth", DEFAULT_MAX_DEPTH)),
        client_backlog=_client_backlog(data.get("client_backlog", DEFAULT_BACKLOG)),
    )


def _client_backlog(value: Any) -> int:
    backlog = as_int(value, "listen.client_backlog", minimum=16)
    if backlog > MAX_BACKLOG:
        raise ConfigError(f"at most {MAX_BACKLOG} messages (each may be as large as an upstream's max_message_size)",
                          path="listen.client_backlog")
    return backlog


_LIMIT_KEYS = {"max_header_size", "max_headers", "max_target_size", "request_timeout", "keep_alive_timeout",
               "refusal_audit"}


def _listen_limits(data: Mapping[str, Any]) -> dict[str, Any]:
    """The HTTP limits of ``listen`` (see ``ListenConfig``), as keyword arguments."""
    d = ListenConfig()
    audit = as_mapping(data.get("refusal_audit"), "listen.refusal_audit")
    check_keys(audit, {"burst", "per_minute"}, "listen.refusal_audit")
    out: dict[str, Any] = {
        "max_header_bytes": parse_size(data.get("max_header_size", d.max_header_bytes), "listen.max_header_size"),
        "max_headers": as_int(data.get("max_headers", d.max_headers), "listen.max_headers", minimum=1),
        "max_target_bytes": parse_size(data.get("max_target_size", d.max_target_bytes), "listen.max_target_size"),
        "request_timeout_s": parse_duration(data.get("request_timeout", d.request_timeout_s),
                                            "listen.request_timeout"),
        "keep_alive_timeout_s": parse_duration(data.get("keep_alive_timeout", d.keep_alive_timeout_s),
                                               "listen.keep_alive_timeout"),
        "refusal_audit_burst": as_int(audit.get("burst", d.refusal_audit_burst), "listen.refusal_audit.burst"),
        "refusal_audit_per_minute": as_int(audit.get("per_minute", d.refusal_audit_per_minute),
                                           "listen.refusal_audit.per_minute"),
    }
    if out["max_target_bytes"] > out["max_header_bytes"]:
        raise ConfigError("cannot exceed listen.max_header_size (the request line counts towards it)",
                          path="listen.max_target_size")
    return out


def _json_depth(value: Any) -> int:
    depth = as_int(value, "listen.max_json_depth", minimum=8)
    if depth > MAX_CONFIGURABLE_DEPTH:
        raise ConfigError(f"at most {MAX_CONFIGURABLE_DEPTH} (deeper messages are refused by the parser itself)",
                          path="listen.max_json_depth")
    return depth


def _catalogue(data: Mapping[str, Any]) -> CatalogueConfig:
    check_keys(data, {"page_size", "separator", "on_collision", "refresh_debounce", "refresh_interval",
                      "gate_timeout", "limits"}, "catalogue")
    on_collision = data.get("on_collision", "first")
    if on_collision not in ("first", "reject"):
        raise ConfigError("must be 'first' or 'reject'", path="catalogue.on_collision")
    separator = data.get("separator", "__")
    if not isinstance(separator, str) or not separator or any(
            not (c.isascii() and (c.isalnum() or c in "_.-")) for c in separator):
        raise ConfigError("must be 1+ characters of [A-Za-z0-9_.-]", path="catalogue.separator")
    return CatalogueConfig(
        page_size=as_int(data.get("page_size", 500), "catalogue.page_size", minimum=1),
        separator=separator,
        on_collision=on_collision,
        refresh_debounce_s=parse_duration(data.get("refresh_debounce", 0.2), "catalogue.refresh_debounce",
                                          allow_zero=True),
        refresh_interval_s=parse_duration(data.get("refresh_interval", 60), "catalogue.refresh_interval",
                                          allow_zero=True),
        gate_timeout_s=parse_duration(data.get("gate_timeout", 2.0), "catalogue.gate_timeout"),
        limits=CatalogueLimits.from_mapping(data.get("limits"), "catalogue.limits"),
    )


def _sessions(data: Mapping[str, Any], env: Mapping[str, str]) -> SessionsConfig:
    check_keys(data, {"idle_timeout", "max_sessions", "max_per_principal", "sweep_interval", "cache", "state_key",
                      "state_ttl"}, "sessions")
    if isinstance(data.get("state_key"), str):
        data = {**data, "state_key": expand_env(data["state_key"], "sessions.state_key", env)}
    return SessionsConfig(
        idle_timeout_s=parse_duration(data.get("idle_timeout", 3600), "sessions.idle_timeout"),
        max_sessions=as_int(data.get("max_sessions", 10_000), "sessions.max_sessions", minimum=1),
        max_per_principal=as_int(data.get("max_per_principal", 100), "sessions.max_per_principal", minimum=1),
        sweep_interval_s=parse_duration(data.get("sweep_interval", 30), "sessions.sweep_interval"),
        cache_s=parse_duration(data.get("cache", 1), "sessions.cache", allow_zero=True),
        state=StateConfig.from_mapping(data, "sessions", environ=env),
    )


def _logging(data: Mapping[str, Any], env: Mapping[str, str]) -> LoggingConfig:
    check_keys(data, {"format", "level"}, "logging")
    fmt = env.get("BASTION_LOG_FORMAT") or data.get("format", "console")
    if fmt not in ("console", "json"):
        raise ConfigError("must be 'console' or 'json'", path="logging.format")
    level = str(env.get("BASTION_LOG_LEVEL") or data.get("level", "info")).lower()
    if level not in ("debug", "info", "warning", "error", "critical"):
        raise ConfigError("must be one of debug, info, warning, error, critical", path="logging.level")
    return LoggingConfig(format="json" if fmt == "json" else "console", level=level)


def parse(data: Any, *, source: str, base_dir: Path, env: Mapping[str, str] | None = None) -> Settings:
    environ = dict(os.environ if env is None else env)
    root = as_mapping(data, "")
    check_keys(root, CORE_KEYS | SECTION_NAMES, "")

    listen = _listen(as_mapping(root.get("listen"), "listen"))
    if environ.get("BASTION_HOST"):
        listen = ListenConfig(**{**_asdict(listen), "host": environ["BASTION_HOST"]})
    if environ.get("BASTION_PORT"):
        try:
            listen = ListenConfig(**{**_asdict(listen), "port": int(environ["BASTION_PORT"])})
        except ValueError:
            raise ConfigError("BASTION_PORT must be an integer") from None

    redis_url = _redis_url(root.get("redis"), environ)

    raw_upstreams = as_mapping(root.get("upstreams"), "upstreams")
    if not raw_upstreams:
        raise ConfigError("at least one upstream is required", path="upstreams")
    upstreams = tuple(
        _resolve_cwd(UpstreamConfig.from_mapping(name, as_mapping(value, f"upstreams.{name}"), "upstreams",
                                                 environ=environ), base_dir)
        for name, value in raw_upstreams.items()
    )
    catalogue = _catalogue(as_mapping(root.get("catalogue"), "catalogue"))
    _check_prefixes(upstreams, catalogue.separator)

    policies_value = root.get("policies")
    policies: tuple[Path, ...] = ()
    if policies_value is not None:
        items = [policies_value] if isinstance(policies_value, str) else as_str_list(policies_value, "policies")
        policies = tuple((base_dir / expand_env(p, "policies")).resolve() for p in items)

    sections = Sections.parse(root, Core(listen_host=listen.host, base_dir=base_dir, redis_url=redis_url))

    return Settings(
        source=source,
        base_dir=base_dir,
        listen=listen,
        upstreams=upstreams,
        redis_url=redis_url,
        catalogue=catalogue,
        sessions=_sessions(as_mapping(root.get("sessions"), "sessions"), environ),
        logging=_logging(as_mapping(root.get("logging"), "logging"), environ),
        policies=policies,
        sections=sections,
        raw=root,
    )


def _resolve_cwd(cfg: Any, base_dir: Path) -> Any:
    # A stdio upstream's working directory is relative to the config file, like every other path in it.
    if cfg.transport == "stdio":
        return replace(cfg, cwd=str((base_dir / (cfg.cwd or ".")).resolve()))
    return cfg


def _asdict(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


def _redis_url(value: Any, env: Mapping[str, str]) -> str | None:
    """The Redis to use as one URL string (see ``bastion.redisconn.RedisTarget`` for the three shapes)."""
    if env.get("BASTION_REDIS_URL"):
        return env["BASTION_REDIS_URL"]
    if value is None:
        return None
    data = as_mapping(value, "redis")
    check_keys(data, {"url", "sentinel", "cluster"}, "redis")
    given = [key for key in ("url", "sentinel", "cluster") if data.get(key) is not None]
    if len(given) != 1:
        raise ConfigError("set exactly one of redis.url, redis.sentinel, redis.cluster", path="redis")
    if given[0] == "sentinel":
        url = _sentinel_url(as_mapping(data["sentinel"], "redis.sentinel"))
    elif given[0] == "cluster":
        url = _cluster_url(as_mapping(data["cluster"], "redis.cluster"))
    else:
        url = expand_env(as_str(data.get("url"), "redis.url"), "redis.url")
    try:
        parse_target(url)
    except ValueError as exc:
        raise ConfigError(str(exc), path=f"redis.{given[0]}") from None
    return url


def _redis_nodes(data: Mapping[str, Any], path: str) -> str:
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) and n for n in nodes):
        raise ConfigError("must be a non-empty list of host:port strings", path=f"{path}.nodes")
    return ",".join(expand_env(n, f"{path}.nodes") for n in nodes)


def _redis_credentials(data: Mapping[str, Any], path: str) -> str:
    user = _optional_secret(data, "username", path)
    password = _optional_secret(data, "password", path)
    if not user and not password:
        return ""
    return f"{quote(user, safe='')}:{quote(password, safe='')}@"


def _optional_secret(data: Mapping[str, Any], key: str, path: str) -> str:
    value = data.get(key)
    return "" if value is None else expand_env(as_str(value, f"{path}.{key}"), f"{path}.{key}")


def _sentinel_url(data: Mapping[str, Any]) -> str:
    path = "redis.sentinel"
    check_keys(data, {"master", "nodes", "username", "password", "sentinel_password", "db"}, path)
    master = as_str(data.get("master"), f"{path}.master")
    if not master:
        raise ConfigError("names the primary the sentinels watch (their 'sentinel monitor' name)",
                          path=f"{path}.master")
    db = data.get("db", 0)
    if not isinstance(db, int) or isinstance(db, bool) or db < 0:
        raise ConfigError("must be a non-negative integer", path=f"{path}.db")
    url = (f"redis+sentinel://{_redis_credentials(data, path)}{_redis_nodes(data, path)}/"
           f"{quote(master, safe='')}/{db}")
    secret = _optional_secret(data, "sentinel_password", path)
    if secret:
        url += "?" + urlencode({"sentinel_password": secret})
    return url


def _cluster_url(data: Mapping[str, Any]) -> str:
    path = "redis.cluster"
    check_keys(data, {"nodes", "username", "password"}, path)
    return f"redis+cluster://{_redis_credentials(data, path)}{_redis_nodes(data, path)}"


def _check_prefixes(upstreams: tuple[Any, ...], separator: str) -> None:
    seen: dict[str, str] = {}
    for up in upstreams:
        prefix = up.prefix
        if not prefix:
            continue
        if prefix in seen:
            raise ConfigError(f"prefix {prefix!r} is also used by upstream {seen[prefix]!r}; tool names would "
                              "collide", path=f"upstreams.{up.name}.prefix")
        seen[prefix] = up.name


def _locate(doc: YamlDoc, exc: ConfigError) -> ConfigError:
    if exc.source is not None:
        return exc
    if exc.path:
        return doc.error(exc.message, exc.path)
    return ConfigError(exc.message, source=doc.source)


def load(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> Settings:
    """Load and validate the config file at ``path`` (default: ``$BASTION_CONFIG``)."""
    environ = os.environ if env is None else env
    chosen = path or environ.get(DEFAULT_CONFIG_ENV)
    if not chosen:
        raise ConfigError(f"no config file given (use --config or set {DEFAULT_CONFIG_ENV})")
    file = Path(chosen)
    # A config file may share blocks through anchors and aliases (policy files may not: see yamlfile).
    doc = load_yaml_file(file, aliases=True)
    try:
        return parse(doc.data, source=str(file), base_dir=file.resolve().parent, env=env)
    except ConfigError as exc:
        raise _locate(doc, exc) from None


def loads(text: str, *, source: str = "<config>", base_dir: Path | None = None,
          env: Mapping[str, str] | None = None) -> Settings:
    doc = load_yaml_text(text, source, aliases=True)
    try:
        return parse(doc.data, source=source, base_dir=base_dir or Path.cwd(), env=env)
    except ConfigError as exc:
        raise _locate(doc, exc) from None
