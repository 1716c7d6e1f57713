"""``bastion check``: find what ``bastion serve`` would refuse, without serving.

Offline it loads the config as ``serve`` does (every key, the API key files it names) and then every policy file,
listing every problem of every file rather than stopping at the first. ``--online`` also contacts what the
config points at: the pin store (and so Redis when pins live there), the one dependency without which ``serve``
hides tools. Warnings name configurations that start but are probably not what was meant.

Exit codes are the ones every ``bastion`` subcommand uses (docs/operations.md, "Exit codes"): 0 fine (warnings
allowed), 1 problems found, 2 usage (no config named), 3 a dependency could not be reached.

Each problem and warning is one line, escaped (``bastion.terminal.printable``): they quote rule ids, names and
paths from the files read, and error texts from Redis.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import TextIO

from bastion import settings as settings_mod
from bastion.errors import ConfigError
from bastion.terminal import printable

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
ONLINE_TIMEOUT_S = 5.0


def warnings(cfg: settings_mod.Settings) -> list[str]:
    """Configurations ``serve`` accepts that are probably mistakes (pure: the loaded settings only)."""
    found = []
    auth = cfg.section("auth")
    if getattr(auth, "mode", None) == "none" and not cfg.listen.is_loopback:
        found.append(f"'auth: none' on a non-loopback listener ({cfg.listen.host}:{cfg.listen.port}): anyone who "
                     "can reach this address calls every tool anonymously; configure api_keys or jwt")
    if not cfg.policies:
        found.append("no 'policies' configured: every authenticated principal may call every tool")
    return found


def run(config: str | None, *, online: bool, out: TextIO, err: TextIO) -> int:
    chosen = config or os.environ.get(settings_mod.DEFAULT_CONFIG_ENV)
    if not chosen:
        print(f"bastion check: error: no config file given (use --config or set {settings_mod.DEFAULT_CONFIG_ENV})",
              file=err)
        return EXIT_USAGE
    try:
        cfg = settings_mod.load(chosen)
    except ConfigError as exc:
        print(f"error: {printable(str(exc))}", file=err)
        return EXIT_PROBLEMS
    problems = _policy_problems(cfg)
    for problem in problems:
        print(f"error: {printable(str(problem))}", file=err)
    for warning in warnings(cfg):
        print(f"warning: {printable(warning)}", file=out)
    if problems:
        print(f"{printable(str(cfg.source))}: {len(problems)} problem(s)", file=err)
        return EXIT_PROBLEMS
    if online:
        unreachable = asyncio.run(_unreachable(cfg))
        for what in unreachable:
            print(f"error: {printable(what)}", file=err)
        if unreachable:
            return EXIT_UNAVAILABLE
    names = ", ".join(f"{u.name} ({'no prefix' if not u.prefix else u.prefix})" for u in cfg.upstreams)
    policies = f", policies in {len(cfg.policies)} path(s)" if cfg.policies else ""
    print(f"{printable(str(cfg.source))}: OK — {len(cfg.upstreams)} upstream(s): {printable(names)}{policies}",
          file=out)
    return EXIT_OK


def _policy_problems(cfg: settings_mod.Settings) -> Sequence[ConfigError]:
    if not cfg.policies:
        return []
    from bastion.policy.load import policy_problems

    return policy_problems(list(cfg.policies))


async def _unreachable(cfg: settings_mod.Settings) -> list[str]:
    """What ``--online`` could not reach, one line each; ``[]`` when everything answered."""
    from bastion.pinning import open_store
    from bastion.redisconn import ADMIN, open_client

    pinning = cfg.section("pinning")
    if pinning is None or not pinning.enabled:
        return []
    client = open_client(cfg.redis_url, ADMIN) if cfg.redis_url else None
    store = open_store(pinning, client)
    try:
        async with asyncio.timeout(ONLINE_TIMEOUT_S):
            await store.load_all()
    except Exception as exc:  # whatever the store raises, the answer is the same: serve would hide tools
        return [f"pin store unreachable ({type(store).__name__}): {exc or type(exc).__name__}"]
    finally:
        try:
            await store.close()
        finally:
            if client is not None:
                await client.aclose()
    return []
