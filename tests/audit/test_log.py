from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from structlog.testing import capture_logs

from bastion.audit.log import AuditLog
from bastion.audit.sinks import FileSink, RedisStreamSink
from bastion.errors import AuditUnavailable
from tests.support.redis_server import RedisServer


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _BrokenSink:
    """A sink with a bug (raises something that is not an AuditSinkError)."""

    name = "broken"

    async def write(self, record: dict[str, Any]) -> None:
        raise KeyError("oops")

    async def close(self) -> None:
        return None


def _rec(i: int) -> dict[str, Any]:
    return {"event": "tool.call", "request_id": f"r{i}"}


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["request_id"] for line in path.read_bytes().splitlines()]


def _bad_file(tmp_path: Path) -> FileSink:
    (tmp_path / "not-a-dir").write_text("")
    return FileSink(tmp_path / "not-a-dir" / "audit.jsonl")


@pytest.mark.parametrize("required", [False, True])
async def test_a_failing_sink_never_stops_the_others(tmp_path: Path, required: bool) -> None:
    good_path = tmp_path / "good.jsonl"
    good, bad = FileSink(good_path), _bad_file(tmp_path)
    failed: list[str] = []
    audit = AuditLog([bad, good], required=required, on_sink_failure=failed.append)
    if required:
        with pytest.raises(AuditUnavailable) as info:
            await audit.emit(_rec(1))
        assert bad.name in (info.value.log_detail or "")
        assert str(tmp_path) not in info.value.message  # the client-facing text names no path
    else:
        await audit.emit(_rec(1))
    await audit.close()
    assert _ids(good_path) == ["r1"]
    assert failed == [bad.name]
    assert audit.failures(bad.name) == 1
    assert audit.failures(good.name) == 0


async def test_failures_are_reported_loudly_but_rate_limited(tmp_path: Path) -> None:
    clock = _Clock()
    bad = _bad_file(tmp_path)
    audit = AuditLog([bad, _BrokenSink()], report_interval_s=60, clock=clock)
    with capture_logs() as logs:
        for i in range(3):
            await audit.emit(_rec(i))
        clock.now += 61
        await audit.emit(_rec(3))
    await audit.close()
    reports = [e for e in logs if e["event"] == "audit.sink_failed"]
    assert all(e["log_level"] == "error" for e in reports)
    by_sink = {(e["sink"], e["suppressed_since_last"], e["failures_total"]) for e in reports}
    assert by_sink == {(bad.name, 0, 1), (bad.name, 2, 4), ("broken", 0, 1), ("broken", 2, 4)}
    assert audit.failures("broken") == 4
    broken = next(e for e in reports if e["sink"] == "broken")
    assert "KeyError" in broken["detail"]


async def test_no_sinks_is_a_no_op() -> None:
    await AuditLog([], required=False).emit(_rec(1))


@pytest.mark.parametrize("required", [False, True])
async def test_redis_going_away(private_redis: RedisServer, tmp_path: Path, required: bool) -> None:
    client = redis.asyncio.from_url(private_redis.url)
    file_path = tmp_path / "audit.jsonl"
    stream = RedisStreamSink(client, "audit", timeout_s=5)
    audit = AuditLog([stream, FileSink(file_path)], required=required)
    try:
        await audit.emit(_rec(1))
        private_redis.kill()
        if required:
            with pytest.raises(AuditUnavailable):
                await audit.emit(_rec(2))
        else:
            await audit.emit(_rec(2))
        assert audit.failures(stream.name) == 1
        private_redis.start()
        await audit.emit(_rec(3))
        assert audit.failures(stream.name) == 1
    finally:
        await audit.close()
        await client.aclose()
    assert _ids(file_path) == ["r1", "r2", "r3"]
