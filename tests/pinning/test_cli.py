from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import redis.asyncio as aioredis

from bastion.pinning import FilePinStore, Pin, Pinning, PinningConfig, PinStore, RedisPinStore, fingerprint
from bastion.pinning.fingerprint import short
from tests.pinning.tools import POISONED, list_dir, read_file
from tests.support.net import free_port
from tests.support.redis_server import RedisServer

T = TypeVar("T")


def pins(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bastion.pinning.cli", "pins", *args], capture_output=True,
                          text=True, timeout=60, check=False)


async def seed(store: PinStore) -> None:
    """files/read_file quarantined with a poisoned change, files/list_dir approved."""
    pinning = Pinning(store, PinningConfig())
    await pinning.reconcile("files", [read_file(), list_dir()])
    await pinning.reconcile("files", [read_file(POISONED), list_dir()])


def check_workflow(where: list[str]) -> None:
    listed = pins("list", *where)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["UPSTREAM", "TOOL", "STATUS", "FINGERPRINT", "APPROVED", "BY", "APPROVED", "AT",
                                "PENDING"]
    assert lines[1].split()[:5] == ["files", "list_dir", "approved", short(fingerprint(list_dir())),
                                    "trust-on-first-use"]
    assert lines[2].split()[:4] == ["files", "read_file", "quarantined", short(fingerprint(read_file()))]
    assert lines[2].split()[-1] == short(fingerprint(read_file(POISONED)))

    only = pins("list", *where, "--status", "quarantined", "--json")
    assert only.returncode == 0, only.stderr
    (row,) = [json.loads(line) for line in only.stdout.splitlines()]
    assert (row["upstream"], row["tool"], row["candidate"]["fingerprint"]) == (
        "files", "read_file", fingerprint(read_file(POISONED)))

    shown = pins("diff", "files", "read_file", *where)
    assert shown.returncode == 0, shown.stderr
    assert f'  description: "Reads a file" -> "{POISONED}"\n' in shown.stdout
    assert f"approve with: bastion pins approve files read_file --fingerprint " \
           f"{short(fingerprint(read_file(POISONED)))}" in shown.stdout

    rejected = pins("reject", "files", "read_file", "--by", "bob", *where)
    assert rejected.returncode == 0, rejected.stderr
    assert rejected.stdout.startswith("rejected files/read_file")
    assert "(rejected by bob)" in pins("list", *where, "--upstream", "files").stdout

    stale = pins("approve", "files", "read_file", "--by", "alice", "--fingerprint", "sha256:0000", *where)
    assert stale.returncode == 1
    assert "review it again" in stale.stderr

    approved = pins("approve", "files", "read_file", "--by", "alice", "--fingerprint",
                    short(fingerprint(read_file(POISONED))), *where)
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout == (f"approved files/read_file: {short(fingerprint(read_file(POISONED)))} "
                               f"(was {short(fingerprint(read_file()))}) by alice\n")
    assert "quarantined" not in pins("list", *where).stdout

    again = pins("approve", "files", "read_file", *where)
    assert (again.returncode, again.stderr) == (1, "bastion pins: error: tool 'read_file' of upstream 'files' "
                                                   "has no pending change\n")
    missing = pins("diff", "files", "nope", *where)
    assert missing.returncode == 1


def test_workflow_on_a_file_store(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    asyncio.run(seed(FilePinStore(path)))
    check_workflow(["--pins-file", str(path)])
    pin = asyncio.run(FilePinStore(path).load("files"))["read_file"]
    assert (pin.status, pin.approved_by, pin.fingerprint) == ("approved", "alice", fingerprint(read_file(POISONED)))


def test_workflow_on_a_redis_store(redis_server: RedisServer) -> None:
    prefix = f"test:{uuid.uuid4().hex}:pins:"

    async def with_store(fn: Callable[[RedisPinStore], Awaitable[T]]) -> T:
        client = aioredis.Redis.from_url(redis_server.url)
        try:
            return await fn(RedisPinStore(client, key_prefix=prefix))
        finally:
            await client.aclose()

    asyncio.run(with_store(seed))
    check_workflow(["--redis-url", redis_server.url, "--redis-key-prefix", prefix])

    async def load(store: RedisPinStore) -> Pin:
        return (await store.load("files"))["read_file"]

    pin = asyncio.run(with_store(load))
    assert (pin.status, pin.approved_by) == ("approved", "alice")


def test_empty_store(tmp_path: Path) -> None:
    result = pins("list", "--pins-file", str(tmp_path / "none.json"))
    assert (result.returncode, result.stdout) == (0, "no pins\n")


@pytest.mark.parametrize(("args", "code", "message"), [
    (["list"], 2, "--pins-file PATH or --redis-url URL"),
    (["list", "--redis-url", "http://x"], 2, "invalid --redis-url"),
    (["list", "--redis-url", "redis://127.0.0.1:{port}/0"], 3, "pin store unavailable"),
])
def test_store_errors(args: list[str], code: int, message: str) -> None:
    port = free_port()
    result = pins(*(a.format(port=port) for a in args))
    assert result.returncode == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    path.write_text("garbage")
    result = pins("list", "--pins-file", str(path))
    assert result.returncode == 3
    assert "not valid JSON" in result.stderr
