"""``bastion approvals list | show | approve | deny``: decide held calls from a terminal.

The CLI is a client of the gateway's admin approvals API (``/admin/approvals`` by default), so it works the same
with or without Redis and every decision is authenticated, authorised (``approvals.admin_groups``) and audited
by the gateway. ``--url`` is the gateway's base URL (``BASTION_URL``); ``--token`` an admin's API key or JWT
(``BASTION_TOKEN``). Exit codes: 0 ok, 1 not pending / not found, 2 usage, connection or authorisation error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import httpx

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
    try:
        with httpx.Client(headers=headers, timeout=10.0) as http:
            if args.approvals_command == "list":
                response = http.get(base)
            elif args.approvals_command == "show":
                response = http.get(f"{base}/{args.id}")
            else:
                action = "approve" if args.approvals_command == "approve" else "deny"
                response = http.post(f"{base}/{args.id}/{action}", json={"channel": "cli"})
    except httpx.HTTPError as exc:
        print(f"error: cannot reach {base}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        data = response.json()
    except ValueError:
        data = {"error": response.text[:200]}
    if response.status_code in (401, 403):
        print(f"error: {data.get('error', response.status_code)} (HTTP {response.status_code})", file=sys.stderr)
        return EXIT_ERROR
    if response.status_code in (404, 409):
        print(f"{data.get('error', 'not found')}", file=sys.stderr)
        return EXIT_MISSING
    if response.status_code != 200:
        print(f"error: HTTP {response.status_code}: {data}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(data, indent=2))
    elif args.approvals_command == "list":
        _print_list(data.get("approvals", []))
    elif args.approvals_command == "show":
        _print_one(data)
    else:
        print(f"{data['id']}: {data['outcome']} by {data['by']}")
    return EXIT_OK


def _print_list(items: list[dict[str, Any]]) -> None:
    if not items:
        print("no pending approvals")
        return
    now = time.time()
    for item in items:
        left = max(0, int(item["expires_at"] - now))
        print(f"{item['id']}  {item['principal']:<16} {item['tool']:<32} rule {item['rule_id']}  {left}s left")


def _print_one(item: dict[str, Any]) -> None:
    for key in ("id", "principal", "tool", "upstream", "rule_id", "message", "session", "replica"):
        print(f"{key + ':':<11}{item.get(key)}")
    print(f"{'via:':<11}{', '.join(item.get('via', []))}")
    print(f"{'expires:':<11}in {max(0, int(item['expires_at'] - time.time()))} s")
    for name, value in item.get("arguments", {}).items():
        print(f"  {name}: {value}")
