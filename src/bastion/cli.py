"""The ``bastion`` command: serve the gateway, check a config, and the admin tools (policy, keys, pins).

Output boundary: every subcommand but ``serve`` runs with ``sys.stdout`` and ``sys.stderr`` escaped for a terminal
(``bastion.terminal.stdio``), and logs escaped console lines to stderr; what they print is full of names and
texts bastion did not write (tool names, annotation keys, rule ids, error texts). ``serve`` writes log lines,
escaped by their renderer (``bastion.logs``), and JSON audit records.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from bastion import __version__
from bastion.errors import ConfigError
from bastion.listener import bind_listener

if TYPE_CHECKING:
    import uvicorn


def _serve(args: argparse.Namespace) -> int:
    from bastion.hangup import ignore_until_started

    # Before the imports below (seconds on a busy host): until the lifespan reloads on SIGHUP, its default action
    # would end the process mid-start.
    ignore_until_started()

    import uvicorn

    from bastion import settings as settings_mod
    from bastion.app import create_app
    from bastion.logs import configure_logging

    cfg = settings_mod.load(args.config)
    configure_logging("json" if cfg.logging.format == "json" else "console", cfg.logging.level)
    host = args.host or cfg.listen.host
    port = args.port if args.port is not None else cfg.listen.port
    # Bind first: a port in use must fail here, before upstreams are spawned and "ready" is logged.
    try:
        sock = bind_listener(host, port)
    except OSError as exc:
        print(f"bastion: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    app = create_app(cfg)
    # uvicorn drains on SIGTERM, then re-raises the signal with the default handler restored, which would end
    # the process with -15 after a clean shutdown; an orchestrator must see exit 0 for a graceful stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # uvicorn handles SIGTERM/SIGINT: it stops accepting, waits for in-flight requests (bounded by
    # timeout_graceful_shutdown), then runs our lifespan shutdown, which closes upstreams and flushes audit sinks.
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=args.grace, server_header=False, proxy_headers=False,
                            # The front door's HTTP limits live in its protocol class (server/protocol.py); no
                            # upgrades.
                            http=app.state.bastion.http_protocol, ws="none",
                            timeout_keep_alive=math.ceil(cfg.listen.keep_alive_timeout_s))
    server = _server(config, app.state.bastion.stop.request)
    server.run(sockets=[sock])
    # As uvicorn.run: a lifespan that failed at start-up (never served) is exit code 3.
    return 0 if server.started else 3


def _server(config: uvicorn.Config, on_exit: Callable[[], None]) -> uvicorn.Server:
    """uvicorn's server, telling the app of a stop as well: uvicorn only sets a flag, which it reads after the
    lifespan's start-up, so a start-up waiting on an upstream would run its waits out first (``StopRequest``)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            on_exit()

    return Server(config)


def _check(args: argparse.Namespace) -> int:
    from bastion.check import run

    return run(args.config, online=args.online, out=sys.stdout, err=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bastion", description="Security gateway for the Model Context Protocol")
    parser.add_argument("--version", action="version", version=f"bastion {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", "-c", help="config file (default: $BASTION_CONFIG)")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.add_argument("--grace", type=int, default=30, help="seconds to let in-flight calls finish on SIGTERM")
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check", help="find what 'serve' would refuse: config, key files, every policy file",
                           description="Exit codes: 0 fine (warnings allowed), 1 problems found, 2 usage error, "
                                       "3 a dependency (--online) could not be reached.")
    check.add_argument("--config", "-c", help="config file (default: $BASTION_CONFIG)")
    check.add_argument("--online", action="store_true",
                       help="also contact the pin store (and its Redis) the config points at")
    check.set_defaults(func=_check)

    from bastion.approvals.cli import register as register_approvals
    from bastion.auth.cli import register as register_keys
    from bastion.pinning.cli import register as register_pins
    from bastion.policy.cli import register as register_policy

    policy = sub.add_parser("policy", help="check, explain and test access policies")
    register_policy(policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND"),
                    gateway_config=_gateway_config)
    register_keys(sub)
    register_approvals(sub)
    register_pins(sub, store_factory=_pin_store, on_decision=_audit_pin_decision)
    return parser


async def _audit_pin_decision(args: argparse.Namespace, event: Any) -> None:
    """Write an approval to the gateway's own audit sinks (file, Redis stream), so the audit log alone tells who
    approved a changed tool definition. A stdout sink is skipped: this process's stdout is the admin's terminal."""
    import os
    import time

    from bastion import settings as settings_mod
    from bastion.audit.config import StdoutSinkConfig, build_audit_log
    from bastion.audit.record import pin_approve_record
    from bastion.redisconn import ADMIN, open_client

    config = getattr(args, "config", None) or os.environ.get("BASTION_CONFIG")
    if event.event != "pin.approved" or not config:
        return
    cfg = settings_mod.load(config)
    audit_cfg = cfg.section("audit")
    sinks = tuple(s for s in audit_cfg.sinks if not isinstance(s, StdoutSinkConfig))
    if not sinks:
        return
    client = open_client(cfg.redis_url, ADMIN) if cfg.redis_url else None
    audit = build_audit_log(replace(audit_cfg, sinks=sinks, required=False), client)
    try:
        await audit.emit(pin_approve_record(at=time.time(), upstream=event.upstream, tool=event.tool,
                                            fingerprint=event.new_fingerprint, approved_by=event.by or "unknown"))
    finally:
        await audit.close()
        if client is not None:
            await client.aclose()


def _gateway_config(path: str) -> tuple[Any, list[Path], Any]:
    """A gateway config's ``auth`` section, policy paths and upstream naming, for ``bastion policy explain
    --config``."""
    from bastion import settings as settings_mod
    from bastion.catalogue import Naming

    cfg = settings_mod.load(path)
    return cfg.section("auth"), list(cfg.policies), Naming.of(cfg.upstreams, cfg.catalogue.separator)


def _pin_store(args: argparse.Namespace) -> Any:
    """The pin store the gateway itself uses, from its config, unless the command names one explicitly."""
    import os

    from bastion.pinning.cli import store_from_args

    config = getattr(args, "config", None) or os.environ.get("BASTION_CONFIG")
    if getattr(args, "pins_file", None) or getattr(args, "redis_url", None) or not config:
        return store_from_args(args)
    from bastion import settings as settings_mod
    from bastion.pinning import open_store
    from bastion.redisconn import ADMIN, open_client

    cfg = settings_mod.load(config)
    client = open_client(cfg.redis_url, ADMIN) if cfg.redis_url else None
    return open_store(cfg.section("pinning"), client)


def main(argv: Sequence[str] | None = None) -> int:
    from bastion.terminal import printable, raw_stdio, stdio

    with stdio():  # argparse's own messages quote arguments back
        parser = build_parser()
        args = parser.parse_args(argv)
        try:
            if args.func is _serve:
                with raw_stdio():
                    code: int = args.func(args)
            else:
                from bastion.logs import configure_cli_logging

                configure_cli_logging()
                code = args.func(args)
        except ConfigError as exc:
            print(f"bastion: configuration error: {printable(str(exc))}", file=sys.stderr)
            return 2
        return code


if __name__ == "__main__":
    sys.exit(main())
