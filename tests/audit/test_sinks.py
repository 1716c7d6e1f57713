from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import redis.asyncio

from bastion.audit.sinks import AuditSinkError, FileSink, RedisStreamSink, StdoutSink
from tests.support.loop import ticking
from tests.support.redis_server import RedisServer


def _rec(i: int) -> dict[str, object]:
    return {"schema_version": 1, "kind": "audit", "event": "tool.call", "request_id": f"r{i}", "pad": "x" * 40}


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def test_file_sink_flushes_every_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    sink = FileSink(path)
    try:
        for i in range(3):
            await sink.write(_rec(i))
            # Read through a separate handle while the sink's stays open: the line must already be on disk.
            assert [r["request_id"] for r in _lines(path)] == [f"r{j}" for j in range(i + 1)]
    finally:
        await sink.close()


async def test_file_sink_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(orjson.dumps(_rec(0)) + b"\n")
    sink = FileSink(path)
    await sink.write(_rec(1))
    await sink.close()
    assert [r["request_id"] for r in _lines(path)] == ["r0", "r1"]


async def test_file_sink_rotates_by_size_keeping_n_backups(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    line_len = len(orjson.dumps(_rec(10))) + 1
    sink = FileSink(path, max_bytes=line_len * 3, backups=2)
    for i in range(10, 30):
        await sink.write(_rec(i))
    await sink.close()
    files = [path.with_name("audit.jsonl.2"), path.with_name("audit.jsonl.1"), path]
    assert not path.with_name("audit.jsonl.3").exists()
    for f in files:
        assert f.stat().st_size <= line_len * 3
    kept = [r["request_id"] for f in files for r in _lines(f)]
    # Oldest backup first, current file last: together the newest records, in order, none duplicated.
    assert kept == [f"r{i}" for i in range(30 - len(kept), 30)]
    assert len(kept) >= 7


async def test_file_sink_without_backups_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    line_len = len(orjson.dumps(_rec(10))) + 1
    sink = FileSink(path, max_bytes=line_len * 2, backups=0)
    for i in range(10, 15):
        await sink.write(_rec(i))
    await sink.close()
    assert [r["request_id"] for r in _lines(path)] == ["r14"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.jsonl"]


async def test_file_sink_failure_is_mapped_and_heals(tmp_path: Path) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the directory should be")
    path = blocker / "audit.jsonl"
    sink = FileSink(path)
    with pytest.raises(AuditSinkError) as info:
        await sink.write(_rec(1))
    assert info.value.sink == f"file:{path}"
    assert not isinstance(info.value.__cause__, OSError)
    blocker.unlink()
    blocker.mkdir()
    await sink.write(_rec(2))
    await sink.close()
    assert [r["request_id"] for r in _lines(path)] == ["r2"]


@pytest.mark.parametrize("how", ["moved", "removed"])
async def test_file_sink_follows_a_file_moved_or_removed_under_it(tmp_path: Path, how: str) -> None:
    # logrotate without copytruncate renames the file; an operator may delete it. Writing on through the open
    # handle raises nothing, so the records would go to the renamed file or to no file at all.
    path = tmp_path / "audit.jsonl"
    sink = FileSink(path)
    await sink.write(_rec(1))
    if how == "moved":
        path.rename(tmp_path / "audit.jsonl.1")
    else:
        path.unlink()
    await sink.write(_rec(2))
    await sink.write(_rec(3))
    await sink.close()
    assert [r["request_id"] for r in _lines(path)] == ["r2", "r3"]
    if how == "moved":
        assert [r["request_id"] for r in _lines(tmp_path / "audit.jsonl.1")] == ["r1"]


async def test_file_sink_whose_file_went_and_cannot_come_back_fails(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    sink = FileSink(logs / "audit.jsonl")
    await sink.write(_rec(1))
    (logs / "audit.jsonl").unlink()
    logs.rmdir()
    logs.write_text("a file where the directory was")
    with pytest.raises(AuditSinkError):
        await sink.write(_rec(2))
    await sink.close()


async def test_file_sink_write_after_close_fails_cleanly(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "a.jsonl")
    await sink.close()
    with pytest.raises(AuditSinkError):
        await sink.write(_rec(1))


async def test_file_sink_concurrent_writes_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    sink = FileSink(path, max_bytes=4000, backups=50)
    await asyncio.gather(*(sink.write(_rec(i)) for i in range(300)))
    await sink.close()
    ids = [r["request_id"] for f in sorted(tmp_path.iterdir()) for r in _lines(f)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(300))


def test_stdout_sink_writes_json_lines_and_logs_stay_on_stderr() -> None:
    script = textwrap.dedent("""
        import asyncio
        import structlog
        from bastion.audit.sinks import StdoutSink
        from bastion.logs import configure_logging

        async def main():
            configure_logging("json", "info")
            sink = StdoutSink()
            structlog.get_logger("bastion.test").info("gateway.started", port=1)
            await asyncio.gather(*(sink.write({"event": "tool.call", "kind": "audit", "request_id": str(i),
                                               "text": "é" * 5000}) for i in range(50)))
            await sink.close()

        asyncio.run(main())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=True)
    lines = proc.stdout.splitlines()
    assert len(lines) == 50
    records = [json.loads(line) for line in lines]
    assert sorted(int(r["request_id"]) for r in records) == list(range(50))
    assert all(r["kind"] == "audit" for r in records)
    logs = [json.loads(line) for line in proc.stderr.splitlines()]
    assert [entry["event"] for entry in logs] == ["gateway.started"]


@pytest.fixture
async def shared_redis(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.from_url(redis_server.url)
    yield client
    await client.aclose()


async def test_redis_stream_sink_appends_entries(shared_redis: redis.asyncio.Redis) -> None:
    key = f"test-audit:{uuid.uuid4().hex}"
    sink = RedisStreamSink(shared_redis, key, maxlen=1000)
    for i in range(3):
        await sink.write(_rec(i))
    await sink.close()
    entries = await shared_redis.xrange(key)
    assert [json.loads(fields[b"record"])["request_id"] for _, fields in entries] == ["r0", "r1", "r2"]
    await shared_redis.delete(key)


async def test_redis_stream_sink_trims_to_about_maxlen(shared_redis: redis.asyncio.Redis) -> None:
    key = f"test-audit:{uuid.uuid4().hex}"
    sink = RedisStreamSink(shared_redis, key, maxlen=10)
    for i in range(400):
        await sink.write(_rec(i))
    length = await shared_redis.xlen(key)
    # "~" trims whole stream nodes (100 entries by default), so the length lands between maxlen and a node more.
    assert 10 <= length < 400
    await shared_redis.delete(key)


async def test_redis_stream_sink_failure_is_mapped_and_heals(private_redis: RedisServer) -> None:
    client = redis.asyncio.from_url(private_redis.url)
    sink = RedisStreamSink(client, "audit", timeout_s=5)
    try:
        await sink.write(_rec(1))
        private_redis.kill()
        with pytest.raises(AuditSinkError) as info:
            await sink.write(_rec(2))
        assert info.value.sink == "redis:audit"
        private_redis.start()
        await sink.write(_rec(3))
        # A fresh server (no persistence): only the record written after the restart is there.
        entries = await client.xrange("audit")
        assert [json.loads(f[b"record"])["request_id"] for _, f in entries] == ["r3"]
    finally:
        await client.aclose()


# -- stdout: a pipe whose reader stalls ---------------------------------------------------------------------------

def _drain(fd: int, into: bytearray) -> threading.Thread:
    def run() -> None:
        while chunk := os.read(fd, 65536):
            into.extend(chunk)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def test_stdout_sink_on_a_full_pipe_holds_back_only_its_writers() -> None:
    r, w = os.pipe()
    sink = StdoutSink(w)
    async with ticking(0.01) as ticks:
        # About 400 KB of records into a 64 KB pipe nobody reads yet: a blocking write would stop the event loop.
        writes = [asyncio.create_task(sink.write({"request_id": i, "pad": "x" * 2000})) for i in range(200)]
        await asyncio.sleep(0.3)
        assert ticks.count >= 10  # the loop went on serving
    assert sink.inline and not all(t.done() for t in writes)  # the pipe took what it could; the rest waits
    got = bytearray()
    reader = _drain(r, got)
    async with asyncio.timeout(10):
        await asyncio.gather(*writes)
    await sink.close()
    os.close(w)
    reader.join(10)
    os.close(r)
    ids = [json.loads(line)["request_id"] for line in bytes(got).splitlines()]
    assert ids == list(range(200))  # whole lines, in the order they were written


async def test_stdout_sink_finishes_a_line_the_pipe_took_part_of_before_the_next() -> None:
    r, w = os.pipe()
    sink = StdoutSink(w)
    big = {"request_id": "big", "pad": "y" * 200_000}  # longer than the pipe: written in part, then the rest
    first = asyncio.create_task(sink.write(big))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(sink.write({"request_id": "after"}))
    got = bytearray()
    reader = _drain(r, got)
    async with asyncio.timeout(10):
        await asyncio.gather(first, second)
    await sink.close()
    os.close(w)
    reader.join(10)
    os.close(r)
    assert [json.loads(line)["request_id"] for line in bytes(got).splitlines()] == ["big", "after"]


async def test_stdout_sink_on_a_descriptor_that_cannot_skip_waiting_writes_every_record(tmp_path: Path) -> None:
    # A regular file (bastion serve > audit.jsonl): most file systems refuse RWF_NOWAIT for buffered writes (ext4
    # does), and the sink then writes everything from its thread.
    path = tmp_path / "stdout.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        sink = StdoutSink(fd)
        await asyncio.gather(*(sink.write(_rec(i)) for i in range(50)))
        await sink.close()
    finally:
        os.close(fd)
    assert [r["request_id"] for r in _lines(path)] == [f"r{i}" for i in range(50)]
