"""Starting the processes a benchmark measures: on chosen CPUs, on free loopback ports, stopped on exit.

Shared by ``sidebyside.py`` and ``catalogue_scale.py``. On a small machine the load generator and the servers
compete for the same cores; pinning them apart (load generator on one CPU, the servers on another) keeps the
load generator's own work from showing up as the servers' latency, and makes runs comparable with each other.
CPU time per call is read from ``/proc`` either way, so it does not depend on the pinning.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from loadgen import REPO, BenchError, stop, wait_port, wait_ready


@dataclass(frozen=True)
class Cpus:
    """Which CPUs the load generator and the servers run on; empty sets: no pinning."""

    loadgen: frozenset[int] = frozenset()
    servers: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str | None) -> Cpus:
        """``LOADGEN:SERVERS`` with comma-separated CPU numbers (``0:1``), or ``none``."""
        if text is None or text == "none":
            return cls()
        left, sep, right = text.partition(":")
        if not sep:
            raise BenchError(f"--cpus {text!r}: expected LOADGEN:SERVERS, e.g. 0:1, or none")
        try:
            loadgen = frozenset(int(c) for c in left.split(","))
            servers = frozenset(int(c) for c in right.split(","))
        except ValueError as exc:
            raise BenchError(f"--cpus {text!r}: CPU numbers must be integers") from exc
        usable = os.sched_getaffinity(0)
        if not (loadgen | servers) <= usable:
            raise BenchError(f"--cpus {text!r}: this process may only run on CPUs {sorted(usable)}")
        return cls(loadgen, servers)

    @classmethod
    def default(cls) -> Cpus:
        """CPU 0 for the load generator and CPU 1 for the servers, when there are two CPUs to split."""
        usable = sorted(os.sched_getaffinity(0))
        return cls(frozenset(usable[:1]), frozenset(usable[1:2])) if len(usable) >= 2 else cls()

    def describe(self) -> str:
        if not self.loadgen:
            return "not pinned"
        return f"load generator on CPU {_set(self.loadgen)}, upstream, proxies and Redis on CPU {_set(self.servers)}"

    def pin_loadgen(self) -> None:
        if self.loadgen:
            os.sched_setaffinity(0, self.loadgen)

    def server_preexec(self) -> Callable[[], None] | None:
        """Run in the child before ``exec``, so that every thread the server starts inherits the pinning."""
        servers = self.servers
        if not servers:
            return None
        return lambda: os.sched_setaffinity(0, servers)


def _set(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


@contextmanager
def started(args: Sequence[str], *, cpus: Cpus, log: Path, port: int | None = None, ready_url: str | None = None,
            cwd: Path = REPO, stdout: Path | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 60.0) -> Iterator[subprocess.Popen[bytes]]:
    """A server process on the servers' CPUs, ready when ``port`` accepts or ``ready_url`` answers 200."""
    with log.open("wb") as err, (stdout.open("wb") if stdout is not None else open(os.devnull, "wb")) as out:
        proc = subprocess.Popen(list(args), cwd=cwd, stdout=out, stderr=err, preexec_fn=cpus.server_preexec(),
                                env=None if env is None else dict(env))
        try:
            try:
                if ready_url is not None:
                    wait_ready(ready_url, proc, log, timeout=timeout)
                elif port is not None:
                    wait_port(port, proc, timeout=timeout)
            except BenchError as exc:
                raise BenchError(f"{exc}\n{log.read_text(errors='replace')[-2000:]}") from exc
            yield proc
        finally:
            stop(proc)


def redis_command(port: int, work: Path) -> list[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise BenchError("redis-server not found (bastion's full configuration needs it)")
    return [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(work)]


def bastion_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "bastion", "serve", "--config", str(config), "--grace", "2"]


def write_config(path: Path, doc: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
    return path


@dataclass(frozen=True)
class ApiKey:
    """A fresh API key for one run: the client sends ``key``, the gateway's config holds ``entry`` (its hash)."""

    key: str
    entry: Mapping[str, Any]

    @classmethod
    def new(cls, key_id: str) -> ApiKey:
        from bastion.auth.apikeys import hash_key

        key = "bst_" + secrets.token_urlsafe(32)
        return cls(key=key, entry={"id": key_id, "hash": hash_key(key)})

    @property
    def headers(self) -> Mapping[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def commit() -> str:
    """The checked-out commit, marked ``+dirty`` when the working tree differs from it (what the gateways ran)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
