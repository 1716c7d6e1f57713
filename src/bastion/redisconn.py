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

import asyncio
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bastion.resp import LeanRedis, LeanTarget

__all__ = ["ClientOptions", "RedisClients", "RedisTarget", "open_client", "open_lean", "open_pubsub", "parse_target"]

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
URL_SCHEMES = ("redis://", "rediss://", "unix://", f"{SENTINEL_SCHEME}://", f"{CLUSTER_SCHEME}://")

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


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where Redis is: one server (``url``), a Sentinel-managed primary, or a Cluster.

    All three shapes travel as one URL string (settings, ``--redis-url``, ``BASTION_REDIS_URL``), so every place
    that names a Redis keeps taking a string:

    - ``redis://``, ``rediss://``, ``unix://``: one server, as redis-py reads it.
    - ``redis+sentinel://[[user]:password@]host:port[,host:port...]/MASTER[/DB][?sentinel_password=...]``
    - ``redis+cluster://[[user]:password@]host:port[,host:port...]``
    """

    kind: str  # "single" | "sentinel" | "cluster"
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def _nodes(netloc_hosts: str, url: str) -> tuple[tuple[str, int], ...]:
    nodes: list[tuple[str, int]] = []
    for part in netloc_hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{url.split('@')[-1]!r}: every node must be host:port, got {part!r}")
        nodes.append((host.strip("[]"), int(port)))
    return tuple(nodes)


def parse_target(url: str) -> RedisTarget:
    """The shape ``url`` names; ``ValueError`` with a precise message when it names none."""
    scheme, _, rest = url.partition("://")
    if scheme not in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        if not url.startswith(URL_SCHEMES[:3]):
            raise ValueError("must be a redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL")
        return RedisTarget(kind="single", url=url)
    # urlsplit refuses a comma-separated port list, so the host list is cut out by hand.
    creds, at, hostpart = rest.rpartition("@") if "@" in rest.split("/", 1)[0] else ("", "", rest)
    hosts, _, path_query = hostpart.partition("/") if "/" in hostpart else hostpart.partition("?")
    split = urlsplit(f"x://h/{path_query}" if "/" in hostpart else f"x://h?{path_query}")
    user, _, password = creds.partition(":") if at else ("", "", "")
    query = parse_qs(split.query)
    sentinel_password = query.get("sentinel_password", [None])[0]
    nodes = _nodes(hosts, url)
    segments = [unquote(seg) for seg in split.path.split("/") if seg]
    if scheme == CLUSTER_SCHEME:
        if segments:
            raise ValueError("a redis+cluster:// URL names no database (a Cluster has only db 0)")
        return RedisTarget(kind="cluster", url=url, nodes=nodes, username=unquote(user) or None,
                           password=unquote(password) or None)
    if not segments or len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
        raise ValueError("a redis+sentinel:// URL needs the master name, then optionally the db: "
                         "redis+sentinel://host:port,host:port/MASTER[/DB]")
    return RedisTarget(kind="sentinel", url=url, nodes=nodes, master=segments[0],
                       db=int(segments[1]) if len(segments) == 2 else 0, username=unquote(user) or None,
                       password=unquote(password) or None, sentinel_password=sentinel_password)


def open_client(url: str, options: ClientOptions) -> aioredis.Redis:
    """A client for ``url`` (any shape ``parse_target`` reads). Connections open lazily."""
    target = parse_target(url)
    if target.kind == "sentinel":
        return _sentinel_client(target, options)
    if target.kind == "cluster":
        return _cluster_client(target, options)
    client: aioredis.Redis = _FailoverSafeRedis.from_url(url, **options.kwargs())
    return client


def _sentinel_client(target: RedisTarget, options: ClientOptions) -> aioredis.Redis:
    # redis-py's own discovery: every new connection asks the sentinels for the current primary, and a connection
    # to a primary demoted to replica raises ConnectionError on its first write (READONLY), so the one retry of
    # ``options`` lands on the new primary. The sentinels get the same short timeouts: a dead sentinel must cost
    # one connect timeout, not a hang, before the next one is asked.
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": options.socket_timeout_s,
                                       "socket_connect_timeout": options.connect_timeout_s}
    if target.sentinel_password:
        sentinel_kwargs["password"] = target.sentinel_password
    sentinel = Sentinel(list(target.nodes), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client: aioredis.Redis = sentinel.master_for(target.master, redis_class=_FailoverSafeRedis, db=target.db,
                                                 username=target.username, password=target.password,
                                                 **options.kwargs())
    return client


def _torn_down(exc: Exception) -> bool:
    """Whether ``exc`` is redis-py using a connection that was closed under it: its reader or writer set to None by
    another task (AttributeError), or its transport already closed by uvloop, which refuses the write with a
    RuntimeError where asyncio's own loop would drop it silently."""
    if isinstance(exc, AttributeError):
        return "'NoneType' object has no attribute" in str(exc)
    return isinstance(exc, RuntimeError) and "the handler is closed" in str(exc)


class _FailoverSafeRedis(aioredis.Redis):
    """redis-py's client (one server, or the primary a Sentinel names), whose commands fail with ``ConnectionError``
    when their connection is closed under them.

    redis-py 8.1 under uvloop: when a connection dies mid-command (a Sentinel failover, a primary killed under load),
    a write on it can raise uvloop's ``RuntimeError: unable to perform operation on <TCPTransport closed=True>; the
    handler is closed`` (seen in tests/redis_ha under load, once in two CI runs). Every use in bastion handles Redis
    errors with its declared failure behaviour, but a RuntimeError escaped them all: a lease release ended its call
    as an internal error. Mapped here, once, it is the connection error it is (as ``_FailoverSafeCluster`` does).
    """

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]  # redis-py's
        except (AttributeError, RuntimeError) as exc:
            if not _torn_down(exc):
                raise
            await self._drop_idle()
            raise RedisConnectionError(f"connection closed under the command: {exc}") from exc

    async def _drop_idle(self) -> None:
        """redis-py put the broken connection back in the pool (its reader and writer look alive): disconnect the
        idle ones, so the next command connects afresh instead of failing on it again."""
        await self.connection_pool.disconnect(inuse_connections=False)

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> aioredis.client.Pipeline:
        return _FailoverSafeRedisPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


class _FailoverSafeRedisPipeline(aioredis.client.Pipeline):
    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error)
        except (AttributeError, RuntimeError) as exc:
            if not _torn_down(exc):
                raise
            await self.connection_pool.disconnect(inuse_connections=False)
            raise RedisConnectionError(f"connection closed under the pipeline: {exc}") from exc


class _FailoverSafeCluster(RedisCluster):
    """RedisCluster whose commands fail with ``ConnectionError`` when a failover closes their connection.

    redis-py 8.1: when a node fails, the cluster client disconnects that node's connections while other tasks are
    mid-command on them; the command then dies with ``AttributeError: 'NoneType' object has no attribute
    'writelines'`` (seen in tests/redis_ha under load, about one run in three). Every use in bastion handles Redis
    errors with its declared failure behaviour, but an AttributeError escaped them all and became an unhandled
    exception in the ASGI app. Mapped here, once, it is the connection error it is.
    """

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except (AttributeError, RuntimeError) as exc:
            if not _torn_down(exc):
                raise
            raise RedisConnectionError(f"connection closed during a cluster failover: {exc}") from exc

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)
        return _FailoverSafePipeline(self, transaction)  # type: ignore[abstract]  # as RedisCluster.pipeline


class _FailoverSafePipeline(ClusterPipeline):
    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute(*args, **kwargs)
        except (AttributeError, RuntimeError) as exc:
            if not _torn_down(exc):
                raise
            raise RedisConnectionError(f"connection closed during a cluster failover: {exc}") from exc


def _cluster_client(target: RedisTarget, options: ClientOptions) -> aioredis.Redis:
    # RedisCluster follows MOVED/ASK redirections and, after a connection error, re-reads the slot map, so a
    # promoted replica is found on the retry. ``retry`` here is the cluster-level retry (with the slot-map
    # refresh); the node connections it makes get the same socket timeouts.
    kwargs = options.kwargs()
    kwargs.pop("retry_on_error")  # RedisCluster retries ConnectionError/TimeoutError/ClusterDownError itself
    cluster = _FailoverSafeCluster(startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
                           username=target.username, password=target.password, **kwargs)
    # Not a subclass of Redis, but it implements every command bastion sends (single-slot keys, scripts whose
    # keys share one hash slot, pipelines, pub/sub, SCAN over all primaries); see docs/operations.md, key layout.
    return cast(aioredis.Redis, cluster)


async def open_pubsub(client: aioredis.Redis) -> aioredis.client.PubSub:
    """A pub/sub object of ``client``, whatever its shape; use it as ``async with``.

    A Cluster client maps slots to nodes only on its first command, and ClusterPubSub (which picks the node that
    serves the channel's slot) reads that map without loading it: on a fresh client SUBSCRIBE failed with a
    KeyError. Loading the map first makes the first subscription work like any later one. Classic PUBLISH is
    broadcast over the cluster bus to every node, so a subscriber on any node hears every publisher.
    """
    # Typed as Redis everywhere (see _cluster_client), so the isinstance check goes through ``object``.
    candidate: object = client
    if isinstance(candidate, RedisCluster):
        await candidate.initialize()
    return client.pubsub()


def open_lean(url: str, options: ClientOptions) -> LeanRedis | None:
    """The lean client of ``bastion.resp`` for ``url`` with these options, or None when ``url`` is not a single
    server that client reads exactly (Sentinel, Cluster, query options): redis-py then serves alone."""
    target = LeanTarget.parse(url) if parse_target(url).kind == "single" else None
    if target is None:
        return None
    return LeanRedis(target, socket_timeout=options.socket_timeout_s, connect_timeout=options.connect_timeout_s,
                     retries=options.retries, health_check_interval=options.health_check_interval_s)


@dataclass(slots=True)
class RedisClients:
    """The gateway's Redis clients, one pool each, so a burst on one use cannot starve another of connections.

    ``shared`` serves sessions, pins, the audit stream and readiness; ``limiter`` the rate limiter, whose short
    timeouts would be wrong for the others. ``limiter_scripts``, when there is one, runs the limiter's scripts on
    the hot path: the lean client, with ``limiter``'s options, on a single server.
    """

    shared: aioredis.Redis
    limiter: aioredis.Redis
    limiter_scripts: LeanRedis | None = None

    @classmethod
    def open(cls, url: str, *, limiter_timeout_s: float, lean: bool = True) -> RedisClients:
        options = limiter_options(limiter_timeout_s)
        return cls(shared=open_client(url, SHARED), limiter=open_client(url, options),
                   limiter_scripts=open_lean(url, options) if lean else None)

    async def warm(self, timeout_s: float = 2.0) -> bool:
        """PING every client once at startup, best effort; True when all answered.

        A Cluster client discovers the slot map, and a Sentinel client the primary, on its first command. Left to
        the first request, that discovery (several round trips, new connections) ran inside the limiter's 250 ms
        budget and, on a loaded machine, refused the first calls with -31004. Redis being down at startup is a
        supported state (each use has its outage behaviour), so a failure here is only logged by the caller.
        """
        async def ping(client: aioredis.Redis | LeanRedis) -> bool:
            try:
                async with asyncio.timeout(timeout_s):
                    await client.ping()
            except (RedisError, OSError, TimeoutError):
                return False
            return True

        checks = [ping(self.shared), ping(self.limiter)]
        if self.limiter_scripts is not None:
            checks.append(ping(self.limiter_scripts))
        results = await asyncio.gather(*checks)
        return all(results)

    async def aclose(self) -> None:
        if self.limiter_scripts is not None:
            await self.limiter_scripts.aclose()
        await self.limiter.aclose()
        await self.shared.aclose()
