"""The feature sections of the config file, each parsed by its own feature module, held typed in ``Sections``.

One class, so the set of valid top-level feature keys is visible in one place and every section has its type.
Each parser receives the section's raw value (``None`` when absent) and what the core already parsed
(``Core``: listen host, config directory, Redis URL); the core itself is parsed by ``bastion.settings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

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

__all__ = ["SECTION_NAMES", "Core", "SectionName", "Sections"]

SectionName = Literal["auth", "audit", "rate_limits", "validation", "sanitize", "pinning", "health", "admin",
                      "tracing", "approvals"]


@dataclass(frozen=True, slots=True)
class Core:
    """What the feature sections need from the core settings, parsed before them."""

    listen_host: str
    base_dir: Path
    redis_url: str | None


@dataclass(frozen=True, slots=True)
class Sections:
    """Every feature section, parsed (a section the file leaves out holds its defaults)."""

    auth: AuthConfig
    audit: AuditConfig
    rate_limits: RateLimitConfig
    validation: ValidationConfig
    sanitize: SanitizeConfig
    pinning: PinningConfig
    health: HealthConfig
    admin: AdminConfig
    tracing: TracingConfig
    approvals: ApprovalsConfig

    @classmethod
    def parse(cls, root: Mapping[str, Any], core: Core) -> Sections:
        # In this order: with several sections wrong, the error names the first of them.
        auth = AuthConfig.from_mapping(root.get("auth"), "auth", listen_host=core.listen_host, base_dir=core.base_dir)
        audit = AuditConfig.from_mapping(root.get("audit"), "audit")
        rate_limits = RateLimitConfig.from_mapping(root.get("rate_limits"), "rate_limits")
        validation = ValidationConfig.from_mapping(root.get("validation") or {}, "validation")
        sanitize = SanitizeConfig.from_mapping(root.get("sanitize"), "sanitize")
        pinning = PinningConfig.from_mapping(root.get("pinning"), "pinning")
        pinning.store_kind(have_redis=core.redis_url is not None)  # store: redis without redis.url is an error
        health = HealthConfig.from_mapping(root.get("health"), "health")
        admin = AdminConfig.from_mapping(root.get("admin"), "admin")
        tracing = TracingConfig.from_mapping(root.get("tracing"), "tracing")
        approvals = ApprovalsConfig.from_mapping(root.get("approvals"), "approvals")
        # Across sections: a console reachable from other machines must be able to tell admins apart.
        admin.check_auth(auth.mode != "none")
        return cls(auth=auth, audit=audit, rate_limits=rate_limits, validation=validation, sanitize=sanitize,
                   pinning=replace(pinning, file=core.base_dir / pinning.file), health=health, admin=admin,
                   tracing=tracing, approvals=approvals)


SECTION_NAMES: frozenset[str] = frozenset(f.name for f in fields(Sections))
