"""What flow-aware rules cost per tools/call: the policy guard and the flow recorder around a no-op forward.

    python bench/bench_flow.py                       # starts its own redis-server on a free loopback port
    python bench/bench_flow.py --redis-url redis://127.0.0.1:6379/0 --n 20000

Scenarios (each a real ``Pipeline`` with the ``PolicyGuard`` and the ``FlowRecorder``, one session per call stream):

- no flow rules: the policy allows; labels exist but no rule has ``when`` (no store read, no write).
- flow rules, other tool: a ``when`` rule exists but is not about the called tool (no read; the call's label is
  written).
- flow rule on the tool (memory / redis): the call reads its context's history (10 earlier touches of
  ``private_data``); its own label is read by no condition, so nothing is written.

Prints calls/s and p50/p99 of one call as seen by its caller, and the Redis commands per call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from bench_limiter import own_redis

from bastion.call import CallContext, CallRecord, Outcome
from bastion.flow import FlowRecorder, FlowStore, MemoryFlowStore, RedisFlowStore, history_reader
from bastion.pipeline import Pipeline
from bastion.policy.cases import tool_entry
from bastion.policy.flow import Touch
from bastion.policy.guard import PolicyGuard, PolicyHolder
from bastion.policy.load import PolicyText, compile_policies
from bastion.principal import Principal
from bastion.redisconn import SHARED, open_client

LABELS = """
labels:
  - {labels: [private_data], tools: [files__read]}
  - {labels: [external_communication], tools: [mail__send]}
"""
NO_FLOW = "version: 1\n" + LABELS + "rules:\n  - {id: all, effect: allow}\n"
FLOW = NO_FLOW + """  - id: trifecta
    effect: deny
    labels: [external_communication]
    when: {touched: [private_data, untrusted_content], within: 30m}
"""
RESULT: dict[str, Any] = {"content": [{"type": "text", "text": "ok"}]}


async def no_audit(ctx: CallContext, record: CallRecord, outcome: Outcome, result: dict[str, Any] | None,
                   total_ms: float, *, error: BaseException | None = None) -> None:
    return None


async def forward(ctx: CallContext, record: CallRecord) -> dict[str, Any]:
    return RESULT


def pipeline(policy_text: str, store: FlowStore) -> tuple[Pipeline, FlowStore]:
    holder = PolicyHolder(compile_policies([PolicyText("bench.yaml", policy_text)]))
    guard = PolicyGuard(holder, history_reader(store))
    return Pipeline([guard], [], FlowRecorder(no_audit, lambda: holder.current, store)), store


async def measure(pipe: Pipeline, store: FlowStore, tool: str, n: int) -> tuple[float, float, float]:
    entry = tool_entry(tool)
    session = uuid.uuid4().hex
    await store.add(f"s:{session}", [Touch("private_data", "files__read", time.time(), f"seed{i}") for i in range(10)],
                    retention_s=86400, max_touches=256)
    principal = Principal(id="bench", groups=frozenset())

    def ctx(i: int) -> CallContext:
        return CallContext(request_id=f"c{i}", principal=principal, tool=entry, arguments={}, session_id=session)

    for i in range(min(500, n)):
        await pipe.run(ctx(i), forward)
    latencies: list[float] = []
    start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter_ns()
        await pipe.run(ctx(i), forward)
        latencies.append((time.perf_counter_ns() - t0) / 1000)
    elapsed = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    return n / elapsed, q[49], q[98]


async def run(url: str, n: int) -> None:
    client = open_client(url, SHARED)
    info = await client.info("server")
    redis_store = RedisFlowStore(client, prefix=f"bench:{uuid.uuid4().hex[:8]}:")
    rows: list[tuple[str, tuple[Pipeline, FlowStore], str, bool]] = [
        ("no flow rules", pipeline(NO_FLOW, MemoryFlowStore()), "mail__send", False),
        ("no flow rules, redis store", pipeline(NO_FLOW, redis_store), "mail__send", True),
        ("flow rules, other tool (memory)", pipeline(FLOW, MemoryFlowStore()), "files__read", False),
        ("flow rules, other tool (redis)", pipeline(FLOW, redis_store), "files__read", True),
        ("flow rule on the tool (memory)", pipeline(FLOW, MemoryFlowStore()), "mail__send", False),
        ("flow rule on the tool (redis)", pipeline(FLOW, redis_store), "mail__send", True),
    ]
    print(f"redis {info['redis_version']}, n={n}, one caller")
    print(f"{'scenario':34} {'calls/s':>9} {'p50 us':>8} {'p99 us':>8} {'redis cmds/call':>16}")
    for name, (pipe, store), tool, redis in rows:
        before = await commands(client) if redis else 0
        ops, p50, p99 = await measure(pipe, store, tool, n)
        # -1 the INFO that reads the counter, -6 the seeding MULTI/EXEC.
        per_call = (await commands(client) - before - 7) / (n + min(500, n)) if redis else 0.0
        print(f"{name:34} {ops:9.0f} {p50:8.1f} {p99:8.1f} {per_call:16.2f}")
    await client.aclose()


async def commands(client: Any) -> int:
    stats = await client.info("stats")
    return int(stats["total_commands_processed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    parser.add_argument("--n", type=int, default=20000, help="calls per scenario")
    args = parser.parse_args()
    if args.redis_url:
        asyncio.run(run(args.redis_url, args.n))
    else:
        with own_redis() as url:
            asyncio.run(run(url, args.n))


if __name__ == "__main__":
    main()
