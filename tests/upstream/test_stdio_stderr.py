"""A stdio child's stderr is its own and may be hostile: lines cut, rate-limited per upstream, escaped, and read in
bounded chunks that yield, so a flood costs neither the log, nor memory, nor other calls their latency."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from bastion.upstream.stderr import StderrLimits, StderrLog, printable, pump_stderr
from bastion.upstream.stdio import StdioUpstream
from tests.upstream.helpers import Inbox

# The stdin loop both servers below end with: answers initialize, and every call with its arguments.
SERVE_ECHO = r'''
for raw in sys.stdin:
    msg = json.loads(raw); mid = msg.get("id")
    if mid is None:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "stderr-test", "version": "1"}}
    else:
        result = {"content": [{"type": "text", "text": json.dumps(msg["params"].get("arguments"))}]}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n"); sys.stdout.flush()
'''

ESCAPES = "hello \x1b]52;c;ZXZpbA==\x07 \x1b[2J\x1b[31mRED\x1b[0m \u202eevil \x9b31m"

# A raw JSON-RPC server with one tool, echo; a thread writes FLOOD to stderr: lines of 10,000 bytes, endlessly.
FLOODING_SERVER = r'''
import json, os, sys, threading
def flood():
    os.write(2, (sys.argv[1] + "\n").encode())
    line = b"E" * 10000 + b"\n"
    while True:
        os.write(2, line * 8)
threading.Thread(target=flood, daemon=True).start()
''' + SERVE_ECHO

# One line of 20 MiB (no newline until its end) after a line of escapes, then a short line, then it serves.
BLOB_SERVER = r'''
import json, os, sys
os.write(2, ("\x1b]52;c;ZXZpbA==\x07" + "B" * (20 * 1024 * 1024) + "\n").encode())
os.write(2, "after the blob \u00e9\n".encode())
''' + SERVE_ECHO


def stderr_events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "upstream.stderr" and e["upstream"] == name]


async def test_a_flooding_child_is_cut_rate_limited_counted_and_still_answers(tmp_path: Path) -> None:
    script = tmp_path / "flood.py"
    script.write_text(FLOODING_SERVER)
    counted: dict[str, int] = {}

    def count(upstream: str, outcome: str, lines: int) -> None:
        assert upstream == "noisy"
        counted[outcome] = counted.get(outcome, 0) + lines

    up = StdioUpstream("noisy", [sys.executable, str(script), ESCAPES], era="legacy")
    # Limits as an upstream's `stderr` settings give them, with a shorter report interval, to see counts here.
    up._stderr_log = StderrLog("noisy", StderrLimits(burst=20, per_second=5.0), report_interval=0.5,
                               on_lines=count)
    with capture_logs() as logs:
        started = time.monotonic()
        await up.start(Inbox())
        try:
            latencies = []
            for i in range(10):
                t = time.monotonic()
                result = await up.request("tools/call", {"name": "echo", "arguments": {"i": i}}, timeout=10)
                latencies.append(time.monotonic() - t)
                assert result["content"][0]["text"] == f'{{"i": {i}}}'
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
            elapsed = time.monotonic() - started
        finally:
            await up.close()
    lines = stderr_events(logs, "noisy")
    # The burst, then 5 a second: the child wrote hundreds of thousands.
    assert 20 <= len(lines) <= 20 + 5 * elapsed + 1
    assert lines[0]["line"] == printable(ESCAPES)
    assert "\x1b" not in lines[0]["line"] and "\u202e" not in lines[0]["line"]
    cut = lines[1:]
    assert cut and all(e["line"] == "E" * 4096 and e["truncated"] is True and e["size"] == 10000 for e in cut)
    counts = [e for e in logs if e["event"] == "upstream.stderr_suppressed"]
    assert counts and all(e["upstream"] == "noisy" and e["count"] > 0 for e in counts)
    assert len(counts) <= elapsed / 0.5 + 2  # at most one per interval, and one when the stream ends
    # The metric's counts: every line the log shows, and at least every line the log says it suppressed.
    assert counted["logged"] == 1 and counted["truncated"] == len(cut)
    assert counted["suppressed"] >= sum(e["count"] for e in counts) > 0
    # Promptly, on a busy machine: the stderr reader must leave the event loop to the stdout reader.
    assert max(latencies) < 1.0, latencies


async def test_an_endless_line_is_logged_cut_without_being_held(tmp_path: Path) -> None:
    script = tmp_path / "blob.py"
    script.write_text(BLOB_SERVER)
    up = StdioUpstream("blob", [sys.executable, str(script)], era="legacy")
    with capture_logs() as logs:
        await up.start(Inbox())
        try:
            async with asyncio.timeout(20):
                while len(stderr_events(logs, "blob")) < 2:
                    await asyncio.sleep(0.05)
            result = await up.request("tools/call", {"name": "echo", "arguments": {}}, timeout=10)
            assert result["content"][0]["text"] == "{}"
        finally:
            await up.close()
    blob, after = stderr_events(logs, "blob")[:2]
    osc = "\x1b]52;c;ZXZpbA==\x07"  # sets an xterm's clipboard
    assert blob["truncated"] is True
    assert blob["size"] == len(osc) + 20 * 1024 * 1024
    assert blob["line"] == printable(osc + "B" * (4096 - len(osc)))
    assert blob["line"].startswith("\\x1b]52;c;ZXZpbA==\\x07BBB")
    assert after["line"] == "after the blob \u00e9" and "truncated" not in after


async def test_reading_holds_one_chunk_and_yields_to_the_event_loop() -> None:
    """8 MiB already buffered: ``read`` never waits, so without its own yields the pump would run to the end
    in one step while every other task waits."""
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    reader.feed_data(b"x" * (8 * 1024 * 1024 - 1) + b"\n")
    reader.feed_data((b"y" * 99 + b"\n") * 10_000)
    reader.feed_eof()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.get_running_loop().create_task(tick())
    await asyncio.sleep(0)
    sink = StderrLog("fast", StderrLimits(burst=3, per_second=0.001))
    with capture_logs() as logs:
        await pump_stderr(reader, sink)
    ticker.cancel()
    assert ticks >= 8
    lines = stderr_events(logs, "fast")
    assert [(len(e["line"]), e.get("size")) for e in lines] == [(4096, 8 * 1024 * 1024 - 1), (99, None), (99, None)]
    assert [e["count"] for e in logs if e["event"] == "upstream.stderr_suppressed"] == [10_000 - 2]


async def pump_pieces(sink: StderrLog, *pieces: bytes) -> list[dict[str, Any]]:
    """Each piece arrives on its own, so the pump reads it as one chunk."""
    reader = asyncio.StreamReader()
    with capture_logs() as logs:
        pumping = asyncio.get_running_loop().create_task(pump_stderr(reader, sink))
        for piece in pieces:
            reader.feed_data(piece)
            for _ in range(3):
                await asyncio.sleep(0)
        reader.feed_eof()
        await pumping
    return logs


async def test_lines_across_chunks() -> None:
    logs = await pump_pieces(StderrLog("split", StderrLimits(max_line_bytes=4)), b"ab", b"c\r\nde", b"fghij\n\n", b"k")
    assert [(e["line"], e.get("size")) for e in logs] == [("abc", None), ("defg", 7), ("", None), ("k", None)]


async def test_lines_over_the_limit_are_counted_across_chunks() -> None:
    logs = await pump_pieces(StderrLog("bulk", StderrLimits(burst=1, per_second=0.001)), b"a\nb\nc\nd", b"e\nf\n", b"g")
    assert [(e["event"], e.get("line", e.get("count"))) for e in logs] == [
        ("upstream.stderr", "a"), ("upstream.stderr_suppressed", 5)]  # b, c, de, f, g


async def test_limits_follow_the_clock() -> None:
    now = [0.0]
    sink = StderrLog("clocked", StderrLimits(burst=2, per_second=1.0), report_interval=5.0, clock=lambda: now[0])
    with capture_logs() as logs:
        assert [sink.line(b"a", 1), sink.line(b"b", 1), sink.line(b"c", 1)] == [True, True, False]
        assert sink.report_in() == 5.0
        now[0] = 1.0
        assert sink.line(b"d", 1)  # a token came back
        assert not sink.line(b"e", 1)
        now[0] = 5.0
        assert sink.line(b"f\r", 2)  # the report is due: written after this line
        assert sink.report_in() is None
    assert [(e["event"], e.get("line", e.get("count"))) for e in logs] == [
        ("upstream.stderr", "a"), ("upstream.stderr", "b"), ("upstream.stderr", "d"),
        ("upstream.stderr", "f"), ("upstream.stderr_suppressed", 2)]


def test_a_cut_never_splits_a_character() -> None:
    sink = StderrLog("utf8", StderrLimits(max_line_bytes=4))
    with capture_logs() as logs:
        sink.line("ab\u00e9".encode()[:3], 4)
    assert logs[0]["line"] == "ab" and logs[0]["size"] == 4


def test_printable_escapes_controls_and_format_characters() -> None:
    assert printable("plain text, ünïcödé ✓") == "plain text, ünïcödé ✓"
    assert printable(ESCAPES) == ("hello \\x1b]52;c;ZXZpbA==\\x07 \\x1b[2J\\x1b[31mRED\\x1b[0m \\u202eevil "
                                  "\\x9b31m")
    assert printable("tab\there\x7f\u2028\U000e0041") == "tab\\x09here\\x7f\\u2028\\U000e0041"


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_no_raw_escape_reaches_either_renderer(fmt: str) -> None:
    # In a process of its own: configure_logging is global.
    script = ("import sys\n"
              "from bastion.logs import configure_logging\n"
              "from bastion.upstream.stderr import StderrLog\n"
              "configure_logging(sys.argv[1])\n"
              "line = sys.argv[2].encode()\n"
              "StderrLog('esc').line(line, len(line))\n")
    done = subprocess.run([sys.executable, "-c", script, fmt, ESCAPES], capture_output=True, timeout=60, check=True)
    assert b"upstream.stderr" in done.stderr
    assert not any(c.encode() in done.stderr for c in "\x1b\x07\x9b\u202e"), done.stderr
