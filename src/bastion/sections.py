"""The feature sections of the config file and the module that parses each.

One table, so the set of valid top-level keys is visible in one place. Each parser receives the section's raw
value (``None`` when absent) and what the core already parsed (listen address, config directory, Redis URL).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from bastion.admin.config import AdminConfig
from bastion.approvals.config import ApprovalsConfig
from bastion.audit.config import AuditConfig
from bastion.auth.config import AuthConfig
from bastion.health.config import HealthConfig
from bastion.pinning import PinningConfig
from bastion.ratelimit.config import RateLimitConfig
from bastion.sanitize.config import SanitizeConfig
from bastion.tracing.config import TracingConfig
from bastion.validation import ValidationConfig

if TYPE_CHECKING:
    from bastion.settings import _Partial


def _auth(data: Any, core: _Partial) -> AuthConfig:
    return AuthConfig.from_mapping(data, "auth", listen_host=core.listen.host, base_dir=core.base_dir)


def _audit(data: Any, core: _Partial) -> AuditConfig:
    return AuditConfig.from_mapping(data, "audit")


def _rate_limits(data: Any, core: _Partial) -> RateLimitConfig:
    return RateLimitConfig.from_mapping(data, "rate_limits")


def _validation(data: Any, core: _Partial) -> ValidationConfig:
    return ValidationConfig.from_mapping(data or {}, "validation")


def _sanitize(data: Any, core: _Partial) -> SanitizeConfig:
    return SanitizeConfig.from_mapping(data, "sanitize")


def _admin(data: Any, core: _Partial) -> AdminConfig:
    return AdminConfig.from_mapping(data, "admin")


def _approvals(data: Any, core: _Partial) -> ApprovalsConfig:
    return ApprovalsConfig.from_mapping(data, "approvals")


def _health(data: Any, core: _Partial) -> HealthConfig:
    return HealthConfig.from_mapping(data, "health")


def _tracing(data: Any, core: _Partial) -> TracingConfig:
    return TracingConfig.from_mapping(data, "tracing")


def _pinning(data: Any, core: _Partial) -> PinningConfig:
    cfg = PinningConfig.from_mapping(data, "pinning")
    cfg.store_kind(have_redis=core.redis_url is not None)  # store: redis without redis.url is a config error
    return replace(cfg, file=core.base_dir / cfg.file)


SECTION_PARSERS: Mapping[str, Callable[[Any, _Partial], Any]] = MappingProxyType({
    "auth": _auth,
    "audit": _audit,
    "rate_limits": _rate_limits,
    "validation": _validation,
    "sanitize": _sanitize,
    "pinning": _pinning,
    "health": _health,
    "admin": _admin,
    "tracing": _tracing,
    "approvals": _approvals,
})
