"""The config file: strictness, locations in errors, environment, and the bastion check command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from bastion import settings
from bastion.admin.config import AdminConfig
from bastion.approvals.config import ApprovalsConfig
from bastion.audit.config import AuditConfig
from bastion.auth.config import AuthConfig
from bastion.errors import ConfigError
from bastion.health.config import HealthConfig
from bastion.pinning import PinningConfig
from bastion.ratelimit.config import RateLimitConfig
from bastion.sanitize.config import SanitizeConfig
from bastion.sections import SECTION_NAMES, SectionName
from bastion.tracing.config import TracingConfig
from bastion.validation import ValidationConfig

BASE = "upstreams:\n  files:\n    command: [python, server.py]\n"


def load(text: str, tmp_path: Path, env: dict[str, str] | None = None) -> settings.Settings:
    path = tmp_path / "bastion.yaml"
    path.write_text(text)
    return settings.load(path, env=env or {})


def test_minimal_config_has_safe_defaults(tmp_path: Path) -> None:
    cfg = load(BASE, tmp_path)
    assert (cfg.listen.host, cfg.listen.port, cfg.listen.path) == ("127.0.0.1", 8080, "/mcp")
    assert cfg.upstreams[0].prefix == "files"
    assert cfg.upstreams[0].cwd == str(tmp_path)
    assert cfg.redis_url is None
    assert cfg.section("auth").mode == "none"


def test_every_feature_section_has_its_type_and_defaults_when_left_out(tmp_path: Path) -> None:
    cfg = load(BASE + "pinning:\n  file: pins.json\n", tmp_path)
    types = {"auth": AuthConfig, "audit": AuditConfig, "rate_limits": RateLimitConfig,
             "validation": ValidationConfig, "sanitize": SanitizeConfig, "pinning": PinningConfig,
             "health": HealthConfig, "admin": AdminConfig, "tracing": TracingConfig, "approvals": ApprovalsConfig}
    assert set(types) == SECTION_NAMES == set(get_args(SectionName))
    for name, kind in types.items():
        assert type(cfg.section(name)) is kind, name  # type: ignore[call-overload]
    assert cfg.section("approvals") == ApprovalsConfig()
    assert cfg.section("pinning").file == tmp_path / "pins.json"  # relative to the config file


@pytest.mark.parametrize(("text", "line", "path", "fragment"), [
    (BASE + "listen:\n  hots: 0.0.0.0\n", 5, "listen.hots", "unknown key"),
    (BASE + "catalog: {}\n", 4, "catalog", "unknown key"),
    (BASE + "    comand: [x]\n", 4, "upstreams.files.comand", "unknown key"),
    (BASE + "listen:\n  port: 80\n  port: 81\n", 6, "listen.port", "duplicate key 'port' (first at line 5)"),
    (BASE + "listen:\n  <<: {port: 80}\n", 5, "listen.<<", "merge keys"),
    (BASE + "logging:\n  level: 2001-13-45\n", 5, "logging.level", "invalid YAML value"),
    (BASE + "catalogue:\n  on_collision: maybe\n", 5, "catalogue.on_collision", "first"),
])
def test_errors_name_file_line_and_key(tmp_path: Path, text: str, line: int, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(text, tmp_path)
    err = info.value
    assert err.source == str(tmp_path / "bastion.yaml")
    assert err.line == line
    assert err.path == path
    assert fragment in err.message
    assert str(err).startswith(f"{tmp_path / 'bastion.yaml'}:{line} [{path}]")


def test_environment_references_and_overrides(tmp_path: Path) -> None:
    text = BASE.replace("command: [python, server.py]", 'url: "https://${HOST}/mcp"\n    headers: '
                        '{Authorization: "Bearer ${TOKEN}"}') + 'redis: {url: "redis://${REDIS:-127.0.0.1}:6379/0"}\n'
    cfg = load(text, tmp_path, {"HOST": "mcp.example", "TOKEN": "t0k", "BASTION_PORT": "9090",
                                "BASTION_LOG_FORMAT": "json"})
    assert cfg.upstreams[0].url == "https://mcp.example/mcp"
    assert cfg.upstreams[0].headers["Authorization"] == "Bearer t0k"
    assert cfg.redis_url == "redis://127.0.0.1:6379/0"
    assert cfg.listen.port == 9090
    assert cfg.logging.format == "json"
    with pytest.raises(ConfigError) as info:
        load(text, tmp_path, {"HOST": "x"})
    assert "TOKEN" in info.value.message


def test_two_upstreams_with_one_prefix_are_refused(tmp_path: Path) -> None:
    text = BASE + "    prefix: shared\n  other:\n    url: http://127.0.0.1:1/mcp\n    prefix: shared\n"
    with pytest.raises(ConfigError) as info:
        load(text, tmp_path)
    assert info.value.path == "upstreams.other.prefix"


def test_a_public_listener_needs_auth_configured(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(BASE + "listen: {host: 0.0.0.0}\n", tmp_path)
    assert "auth" in info.value.message
    assert load(BASE + "listen: {host: 0.0.0.0}\nauth: none\n", tmp_path).listen.host == "0.0.0.0"


def test_check_command_reports_ok_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(BASE)
    done = subprocess.run([sys.executable, "-m", "bastion", "check", "--config", str(good)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    assert "OK" in done.stdout
    assert "no 'policies'" in done.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "listen:\n  prot: 1\n")
    done = subprocess.run([sys.executable, "-m", "bastion", "check", "--config", str(bad)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1  # problems found: the exit code every check command uses
    assert f"{bad}:5 [listen.prot]: unknown key 'prot'" in done.stderr
    assert "Traceback" not in done.stderr


def test_every_example_config_is_valid(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    for config in [root / "examples/demo/bastion.yaml", *sorted((root / "bench/scenarios").glob("*.yaml"))]:
        env = {"BASTION_REDIS_URL": "redis://127.0.0.1:6379/0"} if "redis" in config.name else {}
        settings.load(config, env=env)


def test_listen_http_limits_have_proxy_defaults_and_are_configurable(tmp_path: Path) -> None:
    listen = load(BASE, tmp_path).listen
    assert (listen.max_header_bytes, listen.max_headers, listen.max_target_bytes) == (16384, 100, 8192)
    assert (listen.request_timeout_s, listen.keep_alive_timeout_s) == (10.0, 5.0)
    assert (listen.refusal_audit_burst, listen.refusal_audit_per_minute) == (20, 12)
    listen = load(BASE + "listen:\n  max_header_size: 32KiB\n  max_headers: 50\n  max_target_size: 2KiB\n"
                         "  request_timeout: 2s\n  keep_alive_timeout: 30s\n"
                         "  refusal_audit: {burst: 5, per_minute: 0}\n", tmp_path).listen
    assert (listen.max_header_bytes, listen.max_headers, listen.max_target_bytes) == (32768, 50, 2048)
    assert (listen.request_timeout_s, listen.keep_alive_timeout_s) == (2.0, 30.0)
    assert (listen.refusal_audit_burst, listen.refusal_audit_per_minute) == (5, 0)


@pytest.mark.parametrize(("extra", "path"), [
    ("  max_headers: 0\n", "listen.max_headers"),
    ("  request_timeout: 0\n", "listen.request_timeout"),
    ("  keep_alive_timeout: -1\n", "listen.keep_alive_timeout"),
    ("  max_header_size: 4KiB\n", "listen.max_target_size"),  # the request line counts towards the head
    ("  refusal_audit: {rate: 1}\n", "listen.refusal_audit.rate"),
])
def test_listen_http_limits_are_validated(tmp_path: Path, extra: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(BASE + "listen:\n" + extra, tmp_path)
    assert info.value.path == path or path in str(info.value)


@pytest.mark.parametrize(("value", "seconds"), [(None, 1.0), ("500ms", 0.5), ("0", 0.0), (0, 0.0), ("2s", 2.0)])
def test_sessions_cache_is_a_duration_and_0_turns_it_off(tmp_path: Path, value: object, seconds: float) -> None:
    text = BASE if value is None else BASE + f"sessions:\n  cache: {value!r}\n".replace("'", '"')
    assert load(text, tmp_path).sessions.cache_s == seconds


def test_sessions_max_per_principal_defaults_to_100_and_is_a_positive_integer(tmp_path: Path) -> None:
    assert load(BASE, tmp_path).sessions.max_per_principal == 100
    assert load(BASE + "sessions:\n  max_per_principal: 5\n", tmp_path).sessions.max_per_principal == 5
    for bad in ("0", "-1", "many"):
        with pytest.raises(ConfigError) as info:
            load(BASE + f"sessions:\n  max_per_principal: {bad}\n", tmp_path)
        assert info.value.path == "sessions.max_per_principal"


def test_sessions_cache_cannot_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(BASE + "sessions:\n  cache: -1\n", tmp_path)
    assert info.value.path == "sessions.cache"
