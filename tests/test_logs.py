from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.logs import configure_logging

SCRIPT = textwrap.dedent("""
    import logging, sys
    import structlog
    from bastion.logs import configure_logging

    switches = (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    configure_logging(sys.argv[1], sys.argv[2])
    if len(sys.argv) > 3:  # as before configure_logging turned off what no renderer prints
        logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = switches
    log = structlog.get_logger("bastion.test")
    log.debug("debug.hidden")
    log.info("gateway.started", port=8080, upstreams=["a", "b"])
    logging.getLogger("uvicorn.error").info("Uvicorn running on %s", "http://127.0.0.1:8080",
                                            extra={"color_message": "\\x1b[1mUvicorn\\x1b[0m", "peer": "x"})
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("boom")
""")


def _run(fmt: str, level: str = "info", *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, fmt, level, *extra], capture_output=True, text=True,
                          timeout=60, check=True)


TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT[0-9:.]+Z")


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_the_record_fields_turned_off_for_speed_change_nothing_printed(fmt: str) -> None:
    # configure_logging stops stdlib records from finding their caller's source line and thread and process names:
    # nothing prints them, and a line costs about 40% less.
    fast, full = _run(fmt, "debug").stderr, _run(fmt, "debug", "full-records").stderr
    assert "peer" in fast and "ZeroDivisionError" in fast
    assert TIMESTAMP.sub("T", fast) == TIMESTAMP.sub("T", full)


def test_json_lines_on_stderr_with_stdlib_routed_through() -> None:
    proc = _run("json")
    assert proc.stdout == ""  # stdout belongs to the audit sink
    entries = [json.loads(line) for line in proc.stderr.splitlines()]
    assert [e["event"] for e in entries] == ["gateway.started", "Uvicorn running on http://127.0.0.1:8080", "boom"]
    started, uvicorn, boom = entries
    assert started["port"] == 8080
    assert started["upstreams"] == ["a", "b"]
    assert (started["level"], started["logger"]) == ("info", "bastion.test")
    assert started["timestamp"].endswith("Z")
    assert "T" in started["timestamp"]
    assert (uvicorn["logger"], uvicorn["level"]) == ("uvicorn.error", "info")
    assert uvicorn["timestamp"].endswith("Z")
    assert "color_message" not in uvicorn
    assert "ZeroDivisionError" in boom["exception"]


def test_console_is_for_humans() -> None:
    proc = _run("console")
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert any("gateway.started" in line and "port=8080" in line for line in lines)
    assert any("Uvicorn running on http://127.0.0.1:8080" in line for line in lines)
    assert "ZeroDivisionError" in proc.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[0])


def test_level_filters_both_structlog_and_stdlib() -> None:
    entries = [json.loads(line) for line in _run("json", "debug").stderr.splitlines()]
    assert entries[0]["event"] == "debug.hidden"
    entries = [json.loads(line) for line in _run("json", "error").stderr.splitlines()]
    assert [e["event"] for e in entries] == ["boom"]


def test_bad_level_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        configure_logging("json", "verbose")


STALLED = textwrap.dedent("""
    import sys, time
    import structlog
    from bastion.logs import configure_logging

    configure_logging("json", "info")
    log = structlog.get_logger("bastion.test")
    started = time.monotonic()
    for i in range(int(sys.argv[1])):
        log.info("line", i=i, pad="x" * 1000)
    print(f"took {time.monotonic() - started:.3f}", flush=True)
""")


def test_a_stalled_stderr_reader_never_blocks_the_logging_thread(tmp_path: Path) -> None:
    """stderr is a pipe nobody reads while 3,000 lines (3 MB) are logged: every log call returns at once, the
    lines the pipe and the backlog held arrive whole and in order, and the rest are counted, not lost silently."""
    n = 3000
    out = tmp_path / "stdout.txt"
    with out.open("wb") as stdout:
        proc = subprocess.Popen([sys.executable, "-c", STALLED, str(n)], stdout=stdout, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while "took" not in out.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        # With a blocking handler the logging thread stops at the 64 KB the pipe holds and never gets here.
        assert "took" in out.read_text()
        assert proc.stderr is not None
        err = proc.stderr.read()
        proc.wait(30)
    finally:
        proc.kill()
    entries = [json.loads(line) for line in err.splitlines()]
    lines = [e["i"] for e in entries if e["event"] == "line"]
    assert lines == list(range(len(lines)))  # a prefix, whole and in order
    assert len(lines) >= 900  # about 1.1 KB each: the pipe's 64 KB and the 1 MiB backlog
    (notice,) = [e for e in entries if e["event"] == "logs.dropped"]
    assert notice["count"] == n - len(lines) and notice["level"] == "warning"
