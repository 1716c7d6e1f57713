"""Real Redis topologies on loopback ports: one server, Sentinel (1 primary, 1 replica, 3 sentinels), Cluster
(3 primaries, 3 replicas).

Every shape offers the same handful of operations, so one replica suite runs over all three:

- ``redis_config`` (the gateway's ``redis:`` section) and ``url`` (the same as one URL);
- ``client()``: a synchronous redis-py client that follows the topology, for the tests' own checks;
- ``kill_primary()``: SIGKILL the primary that serves ``key`` (for one server: kill it, then start it again
  empty after ``restart_after_s``, as there is nothing to fail over to), returning when the kill happened;
- ``stop()``.

Timings are short so the failover tests stay bounded: sentinels declare a primary down after 1 s without an
answer, cluster nodes after 1 s (``cluster-node-timeout``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from tests.support.net import free_port, wait_for_port
from tests.support.redis_server import RedisServer

DOWN_AFTER_MS = 1000
CLUSTER_NODE_TIMEOUT_MS = 1000
MASTER = "bastion"


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is a valid, free port too."""
    while True:
        port = free_port()
        if port + 10000 < 65536:
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port


def _exe(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise RuntimeError(f"{name} not found; the test script installs it (apt-get install redis-server)")
    return exe


class Shape(Protocol):
    name: str

    @property
    def redis_config(self) -> dict[str, Any]: ...

    @property
    def url(self) -> str: ...

    def client(self) -> Any: ...

    def kill_primary(self, key: str) -> float:
        """SIGKILL the primary that serves ``key``; the monotonic time read just before the kill."""
        ...

    def stop(self) -> None: ...


class _Node:
    """One redis-server process (data node or sentinel) with its own directory and config file."""

    def __init__(self, root: Path, port: int, lines: list[str], *, sentinel: bool = False) -> None:
        self.port = port
        self.dir = root / str(port)
        self.dir.mkdir(parents=True)
        self.conf = self.dir / "redis.conf"
        base = [f"port {port}", "bind 127.0.0.1", f'dir "{self.dir}"', "protected-mode yes"]
        if not sentinel:
            base += ['save ""', "appendonly no"]
        self.conf.write_text("\n".join(base + lines) + "\n")
        self.sentinel = sentinel
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> _Node:
        args = [_exe("redis-server"), str(self.conf)] + (["--sentinel"] if self.sentinel else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port)
        return self

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)


def _until(what: str, check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.RedisError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{what} not reached within {timeout:g} s ({last!r})")


class SingleShape:
    name = "single"

    def __init__(self, restart_after_s: float = 2.0) -> None:
        self.server = RedisServer().start()
        self.restart_after_s = restart_after_s

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def redis_config(self) -> dict[str, Any]:
        return {"url": self.url}

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=2)

    def kill_primary(self, key: str) -> float:
        # The clock is read before the kill: clients see the connections reset while the process is still being
        # reaped, and a failure then is the kill's, not one before it.
        killed = time.monotonic()
        self.server.kill()
        # Nothing to fail over to: the operator's restart (same port, empty) ends the outage.
        threading.Timer(self.restart_after_s, self.server.start).start()
        return killed

    def stop(self) -> None:
        self.server.stop()


class SentinelShape:
    name = "sentinel"

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="bastion-sentinel-"))
        primary_port = free_port()
        self.data = [_Node(self.root, primary_port, []).start()]
        self.data.append(_Node(self.root, free_port(), [f"replicaof 127.0.0.1 {primary_port}"]).start())
        self.sentinels = [
            _Node(self.root, free_port(), [
                f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2",
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {MASTER} 2000",
                f"sentinel parallel-syncs {MASTER} 1",
            ], sentinel=True).start()
            for _ in range(3)
        ]
        # A failover needs a quorum of sentinels that know each other and the replica: wait for both.
        for s in self.sentinels:
            _until("sentinels discovered", lambda s=s: self._ready(s.client()))
        _until("replica in sync", lambda: self.data[1].client().info("replication").get("master_link_status") == "up")

    @staticmethod
    def _ready(c: redis.Redis) -> bool:
        master = c.execute_command("SENTINEL", "MASTER", MASTER)
        fields = dict(zip(master[::2], master[1::2], strict=True)) if isinstance(master, list) else master
        return int(fields[b"num-other-sentinels"]) == 2 and int(fields[b"num-slaves"]) == 1

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.sentinels]

    @property
    def url(self) -> str:
        return f"redis+sentinel://{','.join(self.nodes)}/{MASTER}/0"

    @property
    def redis_config(self) -> dict[str, Any]:
        return {"sentinel": {"master": MASTER, "nodes": self.nodes}}

    def client(self) -> redis.Redis:
        sentinel = Sentinel([("127.0.0.1", s.port) for s in self.sentinels], socket_timeout=2)
        return sentinel.master_for(MASTER, socket_timeout=2)

    def primary(self) -> _Node:
        _host, port = self.sentinels[0].client().sentinel_get_master_addr_by_name(MASTER)
        return next(n for n in self.data if n.port == int(port))

    def kill_primary(self, key: str) -> float:
        old = self.primary()
        killed = time.monotonic()  # before the kill, as for one server
        old.kill()
        return killed

    def stop(self) -> None:
        for n in self.sentinels + self.data:
            n.kill()
        shutil.rmtree(self.root, ignore_errors=True)


class ClusterShape:
    name = "cluster"

    def __init__(self, primaries: int = 3, replicas: int = 1) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="bastion-cluster-"))
        conf = ["cluster-enabled yes", "cluster-config-file nodes.conf",
                f"cluster-node-timeout {CLUSTER_NODE_TIMEOUT_MS}",
                # A replica may always take over, however long it was cut off: the tests kill primaries at will.
                "cluster-replica-validity-factor 0"]
        self.nodes = [_Node(self.root, _cluster_port(), conf).start() for _ in range(primaries * (1 + replicas))]
        subprocess.run([_exe("redis-cli"), "--cluster", "create",
                        *[f"127.0.0.1:{n.port}" for n in self.nodes],
                        "--cluster-replicas", str(replicas), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        for n in self.nodes:
            _until("cluster state ok", lambda n=n: n.client().cluster("info")["cluster_state"] == "ok")
        _until("replicas attached", lambda: self._replicas_up() == primaries * replicas)

    def _replicas_up(self) -> int:
        up = 0
        for n in self.nodes:
            info = n.client().info("replication")
            up += info.get("role") == "slave" and info.get("master_link_status") == "up"
        return up

    @property
    def startup(self) -> list[str]:
        return [f"127.0.0.1:{n.port}" for n in self.nodes[:3]]

    @property
    def url(self) -> str:
        return f"redis+cluster://{','.join(self.startup)}"

    @property
    def redis_config(self) -> dict[str, Any]:
        return {"cluster": {"nodes": self.startup}}

    def client(self) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, socket_timeout=2)

    def primary_for(self, key: str) -> _Node:
        slot = self.nodes[0].client().cluster("keyslot", key)
        for n in self.nodes:
            if n.proc is None:
                continue
            for start, end, primary, *_ in n.client().execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return next(x for x in self.nodes if x.port == int(primary[1]))
        raise RuntimeError(f"no node serves slot {slot}")

    def kill_primary(self, key: str) -> float:
        primary = self.primary_for(key)
        killed = time.monotonic()  # before the kill, as for one server
        primary.kill()
        return killed

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()
        shutil.rmtree(self.root, ignore_errors=True)


SHAPES = {"single": SingleShape, "sentinel": SentinelShape, "cluster": ClusterShape}


def start_shape(name: str) -> Shape:
    shape: Shape = SHAPES[name]()
    return shape
