"""Process helpers for fault tests: find a process's descendants through /proc (Linux), wait for them to go."""

from __future__ import annotations

import os
import time
from pathlib import Path


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    return int(stat[stat.rindex(")") + 2:].split()[1])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"  # a zombie has exited; only its parent's wait is missing


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren, ...)."""
    parents = {p: _parent(p) for p in (int(d) for d in os.listdir("/proc") if d.isdigit())}
    found: list[int] = []
    frontier = [pid]
    while frontier:
        here = frontier.pop()
        for child, parent in parents.items():
            if parent == here and child not in found:
                found.append(child)
                frontier.append(child)
    return [p for p in found if alive(p)]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after ``timeout`` seconds (empty when all are gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]
