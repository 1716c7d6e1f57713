"""``bastion pins list | diff | approve | reject``: the admin's side of trust on first use.

The commands run on an injected store: ``register`` takes a ``store_factory`` (by default one reading
``--pins-file`` / ``--redis-url``), so the main CLI can build the store from the gateway config instead.

Exit codes: 0 done; 1 no such pin, nothing pending, or the pending change is not the reviewed one; 2 usage;
3 the store is unavailable or unreadable.

Every name, key and value printed here is the upstream's (or a store's) text: each is escaped field by field
(``bastion.terminal.printable``), so a tool name with a newline cannot add a row and one with an escape sequence
cannot hide the rows after it; ``main`` (and the ``bastion`` command's) runs the commands with stdout and stderr
escaped as a whole as well.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TextIO

from bastion.logs import configure_cli_logging
from bastion.pinning.config import PinningConfig
from bastion.pinning.errors import PinningError, PinStoreUnavailable
from bastion.pinning.fingerprint import short
from bastion.pinning.model import PinEvent
from bastion.pinning.service import Pinning
from bastion.pinning.store import DEFAULT_KEY_PREFIX, FilePinStore, PinStore, RedisPinStore
from bastion.redisconn import ADMIN, open_client
from bastion.terminal import json_text, printable, stdio

StoreFactory = Callable[[argparse.Namespace], PinStore]
Command = Callable[[Pinning, argparse.Namespace, TextIO], Awaitable[int]]
DecisionHook = Callable[[argparse.Namespace, PinEvent], Awaitable[None]]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STORE = 0, 1, 2, 3


class UsageError(Exception):
    """Raised by a store factory when the arguments name no usable store."""


def store_from_args(args: argparse.Namespace) -> PinStore:
    if getattr(args, "redis_url", None):
        try:
            client = open_client(args.redis_url, ADMIN)
        except ValueError as exc:
            raise UsageError(f"invalid --redis-url: {exc}") from None
        return RedisPinStore(client, key_prefix=args.redis_key_prefix, owns_client=True)
    if getattr(args, "pins_file", None):
        return FilePinStore(args.pins_file)
    raise UsageError("say where the pins are: --pins-file PATH or --redis-url URL")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], *,
             store_factory: StoreFactory = store_from_args,
             on_decision: DecisionHook | None = None) -> argparse.ArgumentParser:
    """Add ``pins`` and its subcommands; each leaf parser's ``func(args)`` returns an exit code.

    ``on_decision`` receives every approval and rejection (the main CLI writes them to the gateway's audit log).
    """
    store_opts = argparse.ArgumentParser(add_help=False)
    where = store_opts.add_argument_group("pin store")
    where.add_argument("--pins-file", metavar="PATH", help="the file store (pinning.file)")
    where.add_argument("--redis-url", metavar="URL", help="the Redis store, e.g. redis://127.0.0.1:6379/0")
    where.add_argument("--redis-key-prefix", default=DEFAULT_KEY_PREFIX, help=argparse.SUPPRESS)
    where.add_argument("--config", "-c", metavar="FILE",
                       help="take the store from this gateway config (default: $BASTION_CONFIG); "
                            "used by the bastion command when neither --pins-file nor --redis-url is given")

    pins = subparsers.add_parser("pins", help="review and approve changed tool definitions")
    commands = pins.add_subparsers(dest="pins_command", required=True, metavar="COMMAND")

    p = commands.add_parser("list", parents=[store_opts], help="list pinned tools")
    p.add_argument("--upstream", metavar="U")
    p.add_argument("--status", choices=["approved", "quarantined"])
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=_runner(_list, store_factory))

    p = commands.add_parser("diff", parents=[store_opts], help="show a quarantined tool's pending change")
    p.add_argument("upstream")
    p.add_argument("tool")
    p.set_defaults(func=_runner(_diff, store_factory))

    for name, command, what in (("approve", _approve, "approve the pending change"),
                                ("reject", _reject, "reject the pending change; the tool stays quarantined")):
        p = commands.add_parser(name, parents=[store_opts], help=what)
        p.add_argument("upstream")
        p.add_argument("tool")
        p.add_argument("--by", metavar="NAME", default=None, help="who decides (default: the login name)")
        p.add_argument("--fingerprint", metavar="FP",
                       help="only if the pending change still has this fingerprint (or prefix), as shown by diff")
        p.set_defaults(func=_runner(command, store_factory), on_decision=on_decision)
    return pins


def _runner(command: Command, store_factory: StoreFactory) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            store = store_factory(args)
        except UsageError as exc:
            print(f"bastion pins: error: {printable(str(exc))}", file=sys.stderr)
            return EXIT_USAGE
        return asyncio.run(_run(command, store, args))

    return run


async def _run(command: Command, store: PinStore, args: argparse.Namespace) -> int:
    try:
        return await command(Pinning(store, PinningConfig()), args, sys.stdout)
    except PinStoreUnavailable as exc:
        print(f"bastion pins: error: pin store unavailable: {printable(str(exc))}", file=sys.stderr)
        return EXIT_STORE
    except PinningError as exc:
        print(f"bastion pins: error: {printable(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        with contextlib.suppress(PinStoreUnavailable):
            await store.close()


async def _list(pinning: Pinning, args: argparse.Namespace, out: TextIO) -> int:
    items = await pinning.list(args.upstream, status=args.status)
    if args.json:
        for item in items:
            out.write(json_text({"upstream": item.upstream, "tool": item.pin.tool, **item.pin.to_json()},
                                sort_keys=True) + "\n")
        return EXIT_OK
    if not items:
        out.write("no pins\n")
        return EXIT_OK
    rows: list[tuple[str, ...]] = [
        ("UPSTREAM", "TOOL", "STATUS", "FINGERPRINT", "APPROVED BY", "APPROVED AT", "PENDING")]
    for item in items:
        pin, cand = item.pin, item.pin.candidate
        pending = "-" if cand is None else short(cand.fingerprint) + (
            f" (rejected by {cand.rejected_by})" if cand.rejected_by else "")
        rows.append(tuple(printable(cell) for cell in (item.upstream, pin.tool, pin.status, short(pin.fingerprint),
                                                         pin.approved_by, pin.approved_at, pending)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1] + "\n")
    return EXIT_OK


async def _diff(pinning: Pinning, args: argparse.Namespace, out: TextIO) -> int:
    lines = await pinning.diff(args.upstream, args.tool)
    pin = await pinning.get(args.upstream, args.tool)
    assert pin.candidate is not None
    cand = pin.candidate
    p = printable
    out.write(f"{p(args.upstream)}/{p(args.tool)}: {p(pin.status)} since {p(cand.first_seen)}"
              + (f", rejected by {p(cand.rejected_by)} at {p(cand.rejected_at or '')}" if cand.rejected_by else "")
              + "\n")
    out.write(f"  approved {p(pin.fingerprint)} (by {p(pin.approved_by)}, {p(pin.approved_at)})\n")
    out.write(f"  pending  {p(cand.fingerprint)}\n\n")
    for line in lines:  # already printable (fingerprint.diff), keys and values alike
        out.write(f"  {p(line)}\n")
    out.write(f"\napprove with: bastion pins approve {p(args.upstream)} {p(args.tool)} "
              f"--fingerprint {p(short(cand.fingerprint))}\n")
    return EXIT_OK


async def _approve(pinning: Pinning, args: argparse.Namespace, out: TextIO) -> int:
    event = await pinning.approve(args.upstream, args.tool, _who(args), fingerprint=args.fingerprint)
    out.write(f"approved {printable(event.upstream)}/{printable(event.tool)}: {short(event.new_fingerprint)} "
              f"(was {short(event.old_fingerprint or '')}) by {printable(str(event.by))}\n")
    if args.on_decision is not None:
        await args.on_decision(args, event)
    return EXIT_OK


async def _reject(pinning: Pinning, args: argparse.Namespace, out: TextIO) -> int:
    event = await pinning.reject(args.upstream, args.tool, _who(args), fingerprint=args.fingerprint)
    out.write(f"rejected {printable(event.upstream)}/{printable(event.tool)}: {short(event.new_fingerprint)} "
              f"by {printable(str(event.by))}; "
              f"the tool stays quarantined until its definition changes again or is approved\n")
    if args.on_decision is not None:
        await args.on_decision(args, event)
    return EXIT_OK


def _who(args: argparse.Namespace) -> str:
    if args.by:
        return str(args.by)
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "cli"


def main(argv: Sequence[str] | None = None) -> int:
    with stdio():
        # stdout is the command's output (tables, JSON lines); the pin events this process logs go to stderr.
        configure_cli_logging()
        parser = argparse.ArgumentParser(prog="bastion")
        register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(argv)
        return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
