"""The file sink's batching writer, with real files (and a real FIFO for a sink slower than the calls)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest

from bastion.audit.batch import BatchWriter, WriterClosed
from bastion.audit.log import AuditLog
from bastion.audit.sinks import AuditSinkError, FileSink
from bastion.errors import AuditUnavailable


def _rec(emitter: int, seq: int) -> dict[str, object]:
    return {"schema_version": 1, "kind": "audit", "event": "tool.call", "emitter": emitter, "seq": seq}


def _records(*paths: Path) -> list[dict[str, object]]:
    return [json.loads(line) for p in paths if p.exists() for line in p.read_bytes().splitlines()]


@pytest.mark.parametrize("fsync", [False, True])
async def test_many_concurrent_emitters_get_exactly_one_line_each_in_order(tmp_path: Path, fsync: bool) -> None:
    path = tmp_path / "audit.jsonl"
    sink = FileSink(path, fsync=fsync)
    audit = AuditLog([sink], required=True)
    emitters, per_emitter = 40, 25

    async def emitter(e: int) -> None:
        for seq in range(per_emitter):
            await audit.emit(_rec(e, seq))

    await asyncio.gather(*(emitter(e) for e in range(emitters)))
    await audit.close()
    records = _records(path)
    assert len(records) == emitters * per_emitter
    for e in range(emitters):
        assert [r["seq"] for r in records if r["emitter"] == e] == list(range(per_emitter))
    # One hand-off per batch, not per record: 40 emitters in step share their batches.
    assert sink.writer.batches < emitters * per_emitter / 4


async def test_a_write_returns_only_once_its_record_is_in_the_file(tmp_path: Path) -> None:
    # What audit.required relies on (and, with fsync, on the disk): no answer before the record is written.
    path = tmp_path / "audit.jsonl"
    sink = FileSink(path, fsync=True)

    async def emit_and_check(i: int) -> None:
        await sink.write(_rec(i, 0))
        assert {"emitter": i, "seq": 0}.items() <= next(r for r in _records(path) if r["emitter"] == i).items()

    await asyncio.gather(*(emit_and_check(i) for i in range(100)))
    await sink.close()
    assert len(_records(path)) == 100


async def test_batches_respect_rotation_and_keep_order(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    line_len = len(json.dumps(_rec(0, 100), separators=(",", ":"))) + 1
    sink = FileSink(path, max_bytes=line_len * 10, backups=100)
    await asyncio.gather(*(sink.write(_rec(0, 100 + i)) for i in range(95)))
    await sink.close()
    backups = sorted((p for p in tmp_path.iterdir() if p.name != "audit.jsonl"),
                     key=lambda p: -int(p.name.rsplit(".", 1)[1]))
    files = [*backups, path]
    for f in files:
        assert f.stat().st_size <= line_len * 10
    assert [r["seq"] for r in _records(*files)] == [100 + i for i in range(95)]


async def test_close_writes_everything_already_queued(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    sink = FileSink(path)
    writes = [asyncio.create_task(sink.write(_rec(0, i))) for i in range(500)]
    await asyncio.sleep(0)  # the writes are queued, none written yet
    await sink.close()
    await asyncio.gather(*writes)
    assert [r["seq"] for r in _records(path)] == list(range(500))
    with pytest.raises(AuditSinkError):
        await sink.write(_rec(0, 500))
    await sink.close()  # twice is harmless


async def test_the_worker_thread_starts_with_the_first_record_and_stops_at_close(tmp_path: Path) -> None:
    def writers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "bastion-audit-file"}

    before = writers()  # other tests' sinks that were never closed may still have theirs
    sink = FileSink(tmp_path / "audit.jsonl")
    assert writers() == before  # a sink that never writes costs no thread
    await sink.write(_rec(0, 0))
    (mine,) = writers() - before
    await sink.close()
    mine.join(timeout=10)
    assert not mine.is_alive()


async def test_close_reports_a_failing_finish_and_still_stops_the_thread() -> None:
    lines: list[bytes] = []

    def finish() -> None:
        raise OSError(5, "Input/output error")

    writer = BatchWriter(lines.extend, thread_name="bastion-test-finish")
    await writer.submit(b"one\n")
    with pytest.raises(OSError, match="Input/output"):
        await writer.close(finish)
    assert lines == [b"one\n"]
    for thread in threading.enumerate():
        if thread.name == "bastion-test-finish":
            thread.join(timeout=10)
            assert not thread.is_alive()
    with pytest.raises(WriterClosed):
        await writer.submit(b"two\n")


async def test_a_cancelled_caller_still_gets_its_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    sink = FileSink(path)
    write = asyncio.create_task(sink.write(_rec(0, 0)))
    await asyncio.sleep(0)
    write.cancel()
    await sink.write(_rec(0, 1))
    await sink.close()
    assert [r["seq"] for r in _records(path)] == [0, 1]


async def test_a_failed_batch_fails_every_record_in_it_and_the_sink_heals(tmp_path: Path) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the directory should be")
    path = blocker / "audit.jsonl"
    failed: list[str] = []
    audit = AuditLog([FileSink(path)], required=True, on_sink_failure=failed.append)
    results = await asyncio.gather(*(audit.emit(_rec(i, 0)) for i in range(30)), return_exceptions=True)
    assert all(isinstance(r, AuditUnavailable) for r in results)
    assert failed == [f"file:{path}"] * 30  # counted per record, as before batching
    assert audit.failures(f"file:{path}") == 30
    blocker.unlink()
    blocker.mkdir()
    await asyncio.gather(*(audit.emit(_rec(i, 1)) for i in range(30)))
    await audit.close()
    assert sorted(r["emitter"] for r in _records(path)) == list(range(30))


async def test_a_sink_slower_than_the_calls_holds_them_back_and_loses_nothing(tmp_path: Path) -> None:
    # A FIFO nobody reads yet: the worker blocks opening it, like a stalled disk. The queue fills to its bound,
    # further calls wait for room (backpressure), and once the reader drains it every record arrives, in order.
    fifo = tmp_path / "audit.fifo"
    os.mkfifo(fifo)
    sink = FileSink(fifo, max_bytes=0, max_queued=8, max_batch=4)
    emitters, per_emitter = 5, 10

    async def emitter(e: int) -> None:
        for seq in range(per_emitter):
            await sink.write(_rec(e, seq))

    tasks = [asyncio.create_task(emitter(e)) for e in range(emitters)]
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert sink.writer.queued == 5  # every emitter's first record: under the bound, nobody waits yet
    assert not any(t.done() for t in tasks)

    more = [asyncio.create_task(sink.write(_rec(99, i))) for i in range(10)]
    await asyncio.sleep(0.05)
    assert sink.writer.queued == 8  # the bound
    assert sink.writer.waiting == 7  # the rest wait: held back, not dropped
    assert not any(t.done() for t in tasks + more)

    def read_all() -> bytes:
        with fifo.open("rb") as fh:
            return fh.read()

    reader = asyncio.create_task(asyncio.to_thread(read_all))
    await asyncio.gather(*tasks, *more)
    await sink.close()  # the writer closes its end: the reader sees EOF
    records = [json.loads(line) for line in (await reader).splitlines()]
    assert len(records) == emitters * per_emitter + 10
    for e in [*range(emitters), 99]:
        assert [r["seq"] for r in records if r["emitter"] == e] == list(range(10))
