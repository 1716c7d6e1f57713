"""Every Redis client bastion opens, built in one place with the options its use needs.

Why this module exists: ``redis.asyncio.Redis.from_url`` builds its connections with *no* retry (redis-py 8.1:
``Retry(NoBackoff(), 0)``; only the ``Redis(host=...)`` constructor defaults to ten retries with backoff). After a
Redis restart every pooled connection is dead, and without a retry each of them failed one command the next time
the pool handed it out: one "rate limiter unavailable" refusal, one session 503, or one quarantining pin-store
failure per stale connection. Measured with redis-py 8.1.0 against a SIGKILLed and restarted redis-server (see
docs/operations.md, "Redis outages").

The policy for every client here:

- ``retry=Retry(NoBackoff(), 1)`` on ``ConnectionError`` and ``TimeoutError``: a command that meets a dead pooled
  connection is sent again at once on a fresh one, so one stale connection costs no failure. One retry only, and
  no backoff: if the fresh connection fails too, Redis is down, and the caller's declared failure behaviour (not
  a retry loop of several seconds) decides. redis-py's constructor default (ten retries, jittered backoff up to
  1 s) made a single command take 2-4 s to fail during an outage.
- ``health_check_interval``: a connection idle for longer is PINGed before use, so one silently dropped by a NAT or
  a load balancer is replaced instead of timing out a request.
- TCP keepalive (redis-py 8.1 enables it by default for TCP connections): the kernel notices a peer that vanished
  without a FIN/RST (a node that lost power).
- Socket timeouts per use: the limiter keeps its short failure-detection timeout, the shared client a longer one.

Every caller on a request path still bounds each await with its own ``asyncio.timeout``: socket timeouts do not
cover a connect retry plus a second attempt, and the caller's bound is the one documented to users.

A retried command may run twice if the connection died after Redis executed it and before the reply arrived
(never the case after a restart: the new server never saw the first attempt). Each use tolerates that: rate
limits may count a call twice, an audit stream entry may be duplicated, a session create recognises its own write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["ClientOptions", "RedisClients", "open_client"]

# Long enough that a busy gateway never pings (connections are reused within seconds), short enough to beat the
# common idle timeouts of NATs and cloud load balancers (350 s on AWS NAT gateways, 4 min on Azure).
HEALTH_CHECK_INTERVAL_S = 30


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """How one Redis client is built. ``retries`` re-sends a command after a connection or timeout error."""

    socket_timeout_s: float
    connect_timeout_s: float
    retries: int = 1
    health_check_interval_s: int = HEALTH_CHECK_INTERVAL_S

    def kwargs(self) -> dict[str, Any]:
        return {
            "socket_timeout": self.socket_timeout_s,
            "socket_connect_timeout": self.connect_timeout_s,
            "retry": Retry(NoBackoff(), self.retries),
            "retry_on_error": [RedisConnectionError, RedisTimeoutError],
            "health_check_interval": self.health_check_interval_s,
        }


# Sessions, pins, the audit stream and readiness: each bounds its own calls more tightly where it must.
SHARED = ClientOptions(socket_timeout_s=1.0, connect_timeout_s=1.0)
# The admin CLI runs by hand against a possibly remote Redis; patience costs nothing there.
ADMIN = ClientOptions(socket_timeout_s=5.0, connect_timeout_s=5.0)


def limiter_options(timeout_s: float) -> ClientOptions:
    """The rate limiter's client: socket timeouts equal to ``rate_limits.timeout``, its whole budget per call."""
    return ClientOptions(socket_timeout_s=timeout_s, connect_timeout_s=timeout_s)


def open_client(url: str, options: ClientOptions) -> aioredis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://`` or ``unix://``). Connections open lazily."""
    client: aioredis.Redis = aioredis.Redis.from_url(url, **options.kwargs())
    return client


@dataclass(slots=True)
class RedisClients:
    """The gateway's Redis clients, one pool each, so a burst on one use cannot starve another of connections.

    ``shared`` serves sessions, pins, the audit stream and readiness; ``limiter`` the rate limiter, whose short
    timeouts would be wrong for the others.
    """

    shared: aioredis.Redis
    limiter: aioredis.Redis

    @classmethod
    def open(cls, url: str, *, limiter_timeout_s: float) -> RedisClients:
        return cls(shared=open_client(url, SHARED), limiter=open_client(url, limiter_options(limiter_timeout_s)))

    async def aclose(self) -> None:
        await self.limiter.aclose()
        await self.shared.aclose()
