"""``bastion keys generate`` and ``bastion keys hash``: the only ways an admin needs to touch key material."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from bastion.auth.apikeys import generate_key, hash_key
from bastion.auth.config import parse_key_entry
from bastion.errors import ConfigError
from bastion.terminal import printable, stdio


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``keys generate`` and ``keys hash`` to a parent CLI's subparsers."""
    keys = subparsers.add_parser("keys", help="create and hash API keys")
    commands = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")

    gen = commands.add_parser("generate", help="create a new API key; prints it once, with its config entry")
    gen.add_argument("--id", required=True, dest="key_id", help="the principal id the key authenticates as")
    gen.add_argument("--group", action="append", default=[], dest="groups", metavar="GROUP",
                     help="a group of the principal (repeatable)")
    gen.set_defaults(func=_generate)

    hsh = commands.add_parser("hash", help="read a key from stdin and print its sha256:<hex> hash")
    hsh.set_defaults(func=_hash)


def _generate(args: argparse.Namespace) -> int:
    key, entry = generate_key(args.key_id, args.groups)
    try:
        parse_key_entry(entry.to_mapping(), "--id")  # the same rules as the config loader
    except ConfigError as exc:
        print(f"bastion keys generate: {printable(exc.message)}", file=sys.stderr)
        return 2
    print("# The API key. It is shown only this once: hand it to the client; bastion keeps only its hash.")
    print(key)
    print("# Add this entry under auth.api_keys (or to the api_keys_file):")
    print(yaml.safe_dump([entry.to_mapping()], sort_keys=False, default_flow_style=None), end="")
    return 0


def _hash(args: argparse.Namespace) -> int:
    key = sys.stdin.readline().strip()
    if not key:
        print("bastion keys hash: no key on standard input", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    with stdio():
        parser = argparse.ArgumentParser(prog="bastion")
        register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
        args = parser.parse_args(argv)
        code: int = args.func(args)
        return code


if __name__ == "__main__":
    sys.exit(main())
