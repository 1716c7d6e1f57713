"""``bastion approvals list | show | approve | deny``: decide held calls from a terminal.

The CLI is a client of the gateway's admin approvals API (``/admin/approvals`` by default), so it works the same
with or without Redis and every decision is authenticated, authorised (``approvals.admin_groups``) and audited
by the gateway. ``--url`` is the gateway's base URL (``BASTION_URL``); ``--token`` an admin's API key or JWT
(``BASTION_TOKEN``). Exit codes: 0 ok, 1 not pending / not found, 2 usage, connection or authorisation error.

Principals, tool names, arguments and error texts come from the gateway's callers and upstreams: each value is
escaped (``bastion.terminal.printable``) so it stays in its column or on its line, and ``--json`` is written with
every character a terminal would act on as a JSON ``\\uXXXX`` escape.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any
from urllib.parse import quote

import httpx

from bastion.terminal import json_text, printable

EXIT_OK = 0
EXIT_MISSING = 1
EXIT_ERROR = 2


def register(subparsers: Any) -> None:
    approvals = subparsers.add_parser("approvals", help="list and decide calls waiting for human approval")
    sub = approvals.add_subparsers(dest="approvals_command", required=True, metavar="COMMAND")
    for name, help_text in (("list", "pending approvals"), ("show", "one pending approval"),
                            ("approve", "approve a pending call"), ("deny", "decline a pending call")):
        cmd = sub.add_parser(name, help=help_text)
        if name != "list":
            cmd.add_argument("id", help="the approval id (from 'bastion approvals list')")
        cmd.add_argument("--url", default=os.environ.get("BASTION_URL", "http://127.0.0.1:8080"),
                         help="gateway base URL (env BASTION_URL; default http://127.0.0.1:8080)")
        cmd.add_argument("--token", default=os.environ.get("BASTION_TOKEN"),
                         help="an admin's API key or JWT (env BASTION_TOKEN)")
        cmd.add_argument("--path", default="/admin/approvals", help="the API path (approvals.path)")
        cmd.add_argument("--json", action="store_true", help="print JSON")
        cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    base = args.url.rstrip("/") + args.path
    # An id is the gateway's, but it is typed or pasted: one path segment whatever it holds.
    one = f"{base}/{quote(getattr(args, 'id', ''), safe='')}"
    try:
        with httpx.Client(headers=headers, timeout=10.0) as http:
            if args.approvals_command == "list":
                response = http.get(base)
            elif args.approvals_command == "show":
                response = http.get(one)
            else:
                action = "approve" if args.approvals_command == "approve" else "deny"
                response = http.post(f"{one}/{action}", json={"channel": "cli"})
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        print(f"error: cannot reach {printable(base)}: {printable(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    try:
        data = response.json()
    except ValueError:
        data = {"error": response.text[:200]}
    if not isinstance(data, dict):
        data = {"error": str(data)[:200]}
    if response.status_code in (401, 403):
        print(f"error: {printable(str(data.get('error', response.status_code)))} (HTTP {response.status_code})",
              file=sys.stderr)
        return EXIT_ERROR
    if response.status_code in (404, 409):
        print(printable(str(data.get("error", "not found"))), file=sys.stderr)
        return EXIT_MISSING
    if response.status_code != 200:
        print(f"error: HTTP {response.status_code}: {printable(str(data))}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json_text(data, indent=2))
    elif args.approvals_command == "list":
        _print_list(data.get("approvals", []))
    elif args.approvals_command == "show":
        _print_one(data)
    else:
        print(f"{_p(data['id'])}: {_p(data['outcome'])} by {_p(data['by'])}")
    return EXIT_OK


def _print_list(items: list[dict[str, Any]]) -> None:
    if not items:
        print("no pending approvals")
        return
    now = time.time()
    for item in items:
        left = max(0, int(item["expires_at"] - now))
        print(f"{_p(item['id'])}  {_p(item['principal']):<16} {_p(item['tool']):<32} rule {_p(item['rule_id'])}  "
              f"{left}s left")


def _print_one(item: dict[str, Any]) -> None:
    for key in ("id", "principal", "tool", "upstream", "rule_id", "message", "session", "replica"):
        print(f"{key + ':':<11}{_p(item.get(key))}")
    print(f"{'via:':<11}{_p(', '.join(str(v) for v in item.get('via', [])))}")
    print(f"{'expires:':<11}in {max(0, int(item['expires_at'] - time.time()))} s")
    for name, value in item.get("arguments", {}).items():
        print(f"  {_p(name)}: {_p(value)}")


def _p(value: Any) -> str:
    """A value from the gateway, escaped for one field of one line."""
    return printable(value if isinstance(value, str) else str(value))
