"""``bastion.filewatch`` keeps watching whatever a source throws at it: a failure its source did not foresee is a
version that does not load, reported once, and the next good version is applied. On real files, with a source
whose reading fails the way a loader's unforeseen error does (the real loaders' own cases are in
tests/auth/test_key_reload.py and tests/e2e/test_api_key_reload.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from bastion.filewatch import FileWatcher, Fingerprint, stat_files


class TextFile:
    """A watched text file whose value is its text; a text starting with ``crash`` fails to read with an error
    that is not a ``ConfigError``."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def fingerprint(self) -> Fingerprint:
        return stat_files((self.file,), "text file")

    def read(self) -> tuple[str, str]:
        text = self.file.read_text()
        if text.startswith("crash"):
            raise RuntimeError(f"unforeseen, quoting the file: {text}")
        return text, text

    def build(self, content: str) -> str:
        if content.startswith("unbuildable"):
            raise RecursionError("maximum recursion depth exceeded")
        return content

    def version(self, value: str) -> str:
        return value

    def applied(self, new: str, old: str | None) -> None:
        pass

    def failed(self, error: str, current: str | None) -> None:
        pass

    def recovered(self, current: str) -> None:
        pass


def polls(watcher: FileWatcher[str, str], count: int) -> None:
    for _ in range(count):
        watcher.report(watcher.poll())


def test_an_unforeseen_failure_is_a_version_that_does_not_load(tmp_path: Path) -> None:
    file = tmp_path / "f.txt"
    file.write_text("first")
    events: list[tuple[str, str]] = []
    watcher: FileWatcher[str, str] = FileWatcher(
        TextFile(file), lambda v: events.append(("reload", v)), initial="first",
        on_failure=lambda e: events.append(("failure", e)), on_recovered=lambda v: events.append(("recovered", v)))
    file.write_text("crash: a secret line")
    with capture_logs() as logs:
        polls(watcher, 4)
    error = "the files could not be loaded (RuntimeError while reading them)"
    assert events == [("failure", error)]
    # The error names the class, not the message (it may quote the file); the traceback is logged once.
    assert watcher.error == error and watcher.value == "first"
    assert [(e["event"], e["error"]) for e in logs] == [("filewatch.unforeseen_error", "RuntimeError")]
    file.write_text("unbuildable")
    polls(watcher, 2)
    assert events[-1] == ("failure", "the files could not be loaded (RecursionError while building them)")
    file.write_text("second")
    polls(watcher, 2)
    assert events[-1] == ("reload", "second") and watcher.error is None


async def test_the_running_watcher_goes_on_after_an_unforeseen_failure_and_a_failing_callback(
        tmp_path: Path) -> None:
    file = tmp_path / "f.txt"
    file.write_text("first")
    seen: list[str] = []
    changed = asyncio.Event()

    def on_reload(value: str) -> None:
        seen.append(value)
        changed.set()
        if value == "callback fails":
            raise ValueError("a defect in the callback")

    watcher: FileWatcher[str, str] = FileWatcher(TextFile(file), on_reload, interval=0.02, initial="first")
    task = asyncio.create_task(watcher.run())
    try:
        file.write_text("crash")

        async def reported() -> None:
            while watcher.error is None and not task.done():
                await asyncio.sleep(0.02)

        await asyncio.wait_for(reported(), timeout=30)
        assert not task.done(), "the watcher stopped at an unforeseen failure"
        for value in ("callback fails", "last"):
            changed.clear()
            file.write_text(value)
            await asyncio.wait_for(changed.wait(), timeout=30)
        assert seen == ["callback fails", "last"]
        assert not task.done()
    finally:
        task.cancel()
