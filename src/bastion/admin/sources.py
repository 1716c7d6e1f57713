"""What the console reads and acts on: the running gateway's parts, handed over by ``assembly.build``.

The console never reaches into the app by name; everything it shows comes through here, so a page can only show
what this object exposes (no API key hashes, no upstream headers: neither is reachable from it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from bastion.approvals import ApprovalService
from bastion.audit.log import AuditLog
from bastion.auth import Authenticator, KeyRing
from bastion.auth.known import PrincipalDirectory
from bastion.catalogue import Naming
from bastion.health import HealthMonitor
from bastion.pinning.service import Pinning
from bastion.policy.guard import PolicyHolder
from bastion.policy.watch import PolicyWatcher
from bastion.upstream_pool import UpstreamPool
from bastion.view import View


@dataclass(slots=True)
class AdminSources:
    # The catalogue view in force now (``ViewPublisher.view``): read once per page, like a request does.
    view: Callable[[], View]
    pool: UpstreamPool
    monitor: HealthMonitor
    audit_log: AuditLog
    authenticator: Authenticator
    auth_enabled: bool
    pinning: Pinning | None = None
    policy: PolicyHolder | None = None
    policy_watcher: PolicyWatcher | None = None
    # Pending human approvals (list, decide, subscribe) for the approvals page; None: the page says so.
    approvals: ApprovalService | None = None
    # Who the auth config can authenticate (API key ids with their groups and attributes, never the hashes; whether
    # JWT subjects are accepted): the principal as the gateway sees it, for the catalogue's per-principal view and
    # the explain form (``PrincipalDirectory.resolve``, as ``bastion policy explain --config``).
    principals: PrincipalDirectory = field(default_factory=PrincipalDirectory)
    # The key table in force (reloads of ``auth.api_keys_file`` swap it): the directory's keys, and what a console
    # session opened with a key stays bound to. None without API keys.
    keys: KeyRing | None = None
    # The configured prefixes: the upstream of a tool the catalogue does not list now, for the explain form.
    naming: Naming = field(default_factory=Naming)
    # The number of live sessions, as the sweeper last counted them (``None``: not counted yet).
    sessions: Callable[[], int | None] = lambda: None
    started_at: float = field(default_factory=time.time)
    # Restarts per upstream since start, counted by the assembly's health transition handler.
    restarts: Mapping[str, int] = field(default_factory=dict)
    # Redis, when configured (``redis_url``): console logouts reach every replica sharing it (``revocation.py``).
    redis: aioredis.Redis | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def directory(self) -> PrincipalDirectory:
        """``principals`` with the key table in force now."""
        return self.principals if self.keys is None else self.principals.with_keys(self.keys.table.entries)
