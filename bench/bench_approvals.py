"""What `effect: approve` costs calls it does not hold: the policy decision with an approve rule in the set, and
the approval guard's pass-through. Best of ``--repeat`` runs of ``--n`` iterations each.

    python bench/bench_approvals.py [--n 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import AsyncExitStack

from bastion.approvals import ApprovalsConfig, ApprovalService
from bastion.approvals.guard import ApprovalGuard
from bastion.call import CallContext, CallRecord
from bastion.policy.cases import tool_entry
from bastion.policy.load import PolicyText, compile_policies
from bastion.principal import Principal

BASE = "version: 1\nrules:\n  - {id: a, effect: allow, tools: ['fs__*']}\n"
WITH_APPROVE = BASE + "  - {id: d, effect: approve, annotations: {destructiveHint: true}}\n"


def decide_us(text: str, n: int) -> float:
    policy = compile_policies([PolicyText("p.yaml", text)])
    principal = Principal(id="alice")
    tool = tool_entry("fs__read", annotations={"readOnlyHint": True})
    started = time.perf_counter()
    for _ in range(n):
        policy.decide(principal, tool, {})
    return (time.perf_counter() - started) / n * 1e6


async def guard_us(n: int) -> float:
    guard = ApprovalGuard(ApprovalService(ApprovalsConfig()))
    ctx = CallContext(request_id="r", principal=Principal(id="alice"), tool=tool_entry("fs__read"), arguments={})
    record, stack = CallRecord(), AsyncExitStack()
    started = time.perf_counter()
    for _ in range(n):
        await guard.check(ctx, record, stack)
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = {
        "policy decide, allow rule only": min(decide_us(BASE, args.n) for _ in range(args.repeat)),
        "policy decide, plus an approve rule": min(decide_us(WITH_APPROVE, args.n) for _ in range(args.repeat)),
        "approval guard, call not held": min(asyncio.run(guard_us(args.n)) for _ in range(args.repeat)),
    }
    for name, value in rows.items():
        print(f"{name:<40} {value:8.2f} us")


if __name__ == "__main__":
    main()
