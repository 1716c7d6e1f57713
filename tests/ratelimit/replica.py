"""A second bastion replica in its own OS process, for the cross-process tests.

``burst URL PREFIX N LIMIT``: prints ``ready``, waits for a line on stdin, then fires N concurrent checks against
a LIMIT/hour limit and prints the number admitted.
``hold URL PREFIX LEASE_TTL``: takes one lease of a cap of 1, prints ``held`` and keeps it (renewing) until killed.
"""

from __future__ import annotations

import asyncio
import sys

from redis.asyncio import Redis

from bastion.ratelimit.gcra import RateCheck
from bastion.ratelimit.limiter import CapCheck
from bastion.ratelimit.model import Rate, RateLimitSpec
from bastion.ratelimit.redis_limiter import RedisLimiter


async def burst(url: str, prefix: str, n: int, limit: int) -> None:
    client = Redis.from_url(url)
    limiter = RedisLimiter(client, key_prefix=prefix, timeout_s=10.0)
    spec = RateLimitSpec(name="exact", scope="global", rate=Rate(limit, 3600.0))
    check = RateCheck.from_spec(spec, "exact:global")
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    verdicts = await asyncio.gather(*(limiter.check([check]) for _ in range(n)))
    print(sum(v.allowed for v in verdicts), flush=True)
    await client.aclose()


async def hold(url: str, prefix: str, lease_ttl_s: float) -> None:
    client = Redis.from_url(url)
    limiter = RedisLimiter(client, key_prefix=prefix, timeout_s=10.0, lease_ttl_s=lease_ttl_s)
    async with limiter.lease([CapCheck(name="one", key="one:global", max=1)]):
        print("held", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    mode, url, prefix, *rest = sys.argv[1:]
    if mode == "burst":
        asyncio.run(burst(url, prefix, int(rest[0]), int(rest[1])))
    else:
        asyncio.run(hold(url, prefix, float(rest[0])))
