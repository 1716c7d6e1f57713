"""The admin console: a server-rendered web UI on its own listener (``admin:`` config), see docs/console.md."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp

from bastion.admin.config import AdminConfig
from bastion.admin.console import Console
from bastion.admin.server import AdminServer
from bastion.admin.sources import AdminSources
from bastion.admin.tap import AuditTap
from bastion.auth.known import known_principals

__all__ = ["AdminConfig", "AdminConsole", "AdminSources", "build_console", "known_principals"]


class AdminConsole:
    """The console and its listener, as the gateway's lifespan starts and stops them."""

    def __init__(self, console: Console, server: AdminServer) -> None:
        self.console = console
        self.server = server

    @property
    def port(self) -> int:
        return self.server.port

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        self.console.closing.set()
        await self.server.stop()


def build_console(cfg: AdminConfig, src: AdminSources,
                  guard: Callable[[ASGIApp], ASGIApp] | None = None) -> AdminConsole:
    """Subscribe to the audit log and build the app; nothing listens until ``start``. ``guard`` puts the app
    behind the listener's Host check (the gateway's own mechanism, ``server/asgi.Guarded``, wired by the
    assembly, which knows both)."""
    tap = AuditTap(cfg.live_buffer)
    src.audit_log.listeners.append(tap)
    console = Console(cfg, src, tap, guard=guard)
    return AdminConsole(console, AdminServer(console.asgi(), cfg.host, cfg.port))
