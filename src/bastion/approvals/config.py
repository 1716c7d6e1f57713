"""The ``approvals:`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bastion.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ApprovalsConfig:
    """Bounds on pending approvals and who may decide them.

    ``admin_groups``: principals in any of these groups may list and decide approvals over the admin API.
    ``path``: where the admin API lives on the main listener.
    """

    max_pending: int = 1000
    max_pending_per_principal: int = 10
    admin_groups: tuple[str, ...] = ("bastion-admins",)
    path: str = "/admin/approvals"

    @classmethod
    def from_mapping(cls, data: Any, path: str) -> ApprovalsConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", path=path)
        allowed = {"max_pending", "max_pending_per_principal", "admin_groups", "path"}
        for key in data:
            if key not in allowed:
                raise ConfigError(f"unknown key {key!r} (allowed: {', '.join(sorted(allowed))})",
                                  path=f"{path}.{key}")
        out = cls()
        for key in ("max_pending", "max_pending_per_principal"):
            value = data.get(key, getattr(out, key))
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError("expected an integer >= 1", path=f"{path}.{key}")
        groups = data.get("admin_groups", list(out.admin_groups))
        if not isinstance(groups, list) or not groups or not all(isinstance(g, str) and g for g in groups):
            raise ConfigError("expected a non-empty list of group names", path=f"{path}.admin_groups")
        url_path = data.get("path", out.path)
        if not isinstance(url_path, str) or not url_path.startswith("/") or url_path.endswith("/"):
            raise ConfigError("expected an absolute path without a trailing '/'", path=f"{path}.path")
        return cls(max_pending=data.get("max_pending", out.max_pending),
                   max_pending_per_principal=data.get("max_pending_per_principal", out.max_pending_per_principal),
                   admin_groups=tuple(groups), path=url_path)
