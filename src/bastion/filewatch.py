"""Hot reload of files bastion reads while it runs (the policy files, the API key file): poll them, swap in what
they hold only once it validates and has stopped changing.

Polling rather than inotify: it works the same on every platform and inside Kubernetes, where a ConfigMap or Secret
update swaps a ``..data`` symlink instead of writing the files (stat follows the links, so the change shows). A
change of mtime, size or inode triggers a read; every ``full_check_every`` polls the files are read anyway, so a
rewrite that keeps mtime and size is still seen.

A poll sees the files at one instant, and files are rarely changed in one instant: an editor moves the old file
aside before writing the new one, ``cp`` and ``git checkout`` write a file in several calls and a directory file by
file. A read in such a window finds content that may be valid but is not what anybody wrote (a directory without
its deny file, a key file cut after its first entries). So what a poll finds is acted on only once the next poll,
an interval later, finds exactly the same (``_Seen``): a state that lasted less than an interval is never applied
nor reported. That holds for errors too (a file missing for a moment is no broken edit), and an error belongs to
what was read: reading the content in force again ends it, however the error came about. ``request_reload``
(SIGHUP) and ``reload_now`` decide at once.

What is watched is a ``Source``: how to stat, read and build it, and the log lines its outcomes write. The watcher
owns only the when.

A watcher never stops watching while its task runs. Revoking an API key or tightening the policy relies on the
next good version being applied, so a source that fails in a way it did not foresee (a ``ValueError`` from bytes that
are not UTF-8, a ``RecursionError`` from YAML nested thousands deep) is a version that does not load like any other:
reported once, with the value in force kept and the error shown, and the next good version applied. Had it ended
the polling loop, every later edit would be ignored in silence while the status still read ``ok``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import structlog

from bastion.errors import ConfigError

__all__ = ["Applied", "Failed", "FileWatcher", "Fingerprint", "Outcome", "Recovered", "Source", "now_iso",
           "stat_files"]

T = TypeVar("T")
R = TypeVar("R")

# (path, mtime_ns, size, inode) of every file read.
Fingerprint = tuple[tuple[str, int, int, int], ...]


class Source(Protocol[T, R]):
    """What a ``FileWatcher`` watches. ``fingerprint``, ``read`` and ``build`` run in a worker thread and raise
    ``ConfigError``; the log hooks run there too (structlog is thread-safe)."""

    def fingerprint(self) -> Fingerprint:
        """What the files look like without reading them: a change here makes the next poll read them."""
        ...

    def read(self) -> tuple[str, R]:
        """The files' content: its version (equal versions, equal content) and what ``build`` takes."""
        ...

    def build(self, content: R) -> T:
        """The value the content stands for; ``ConfigError`` when it is invalid."""
        ...

    def version(self, value: T) -> str:
        """The version of the content ``value`` was built from (as ``read`` gives it)."""
        ...

    def applied(self, new: T, old: T | None) -> None:
        """Log a swap."""
        ...

    def failed(self, error: str, current: T | None) -> None:
        """Log a new broken version (``current`` stays in force)."""
        ...

    def recovered(self, current: T) -> None:
        """Log that the files read as the value in force again after an error."""
        ...


@dataclass(frozen=True, slots=True)
class _Seen:
    """What one poll found: the content's version, or why the files could not be read."""

    content: str | None
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class _State(Generic[T]):
    value: T | None
    loaded_at: str | None
    error: str | None
    fingerprint: Fingerprint | None
    # What was last decided on, good or bad: each bad version is reported once.
    decided: _Seen | None
    # Something else, found by the last poll and not yet decided on: the next poll decides if it finds it again.
    pending: _Seen | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    error: str


@dataclass(frozen=True, slots=True)
class Recovered(Generic[T]):
    value: T


@dataclass(frozen=True, slots=True)
class Applied(Generic[T]):
    value: T


Outcome = Applied[T] | Failed | Recovered[T] | None

log = structlog.get_logger("bastion.filewatch")


class FileWatcher(Generic[T, R]):
    """Watch ``source`` and call ``on_reload`` with every new valid value, ``on_failure`` with the error of every
    new broken version, and ``on_recovered`` when the files read as the value in force again after an error.

    With ``initial`` given (what the process started with), only changes are reported; without it the value found
    first is reported.
    """

    def __init__(self, source: Source[T, R], on_reload: Callable[[T], None], interval: float = 1.0, *,
                 initial: T | None = None, full_check_every: int = 10,
                 on_failure: Callable[[str], None] | None = None,
                 on_recovered: Callable[[T], None] | None = None) -> None:
        self._source = source
        self._on_reload = on_reload
        self._on_failure = on_failure
        self._on_recovered = on_recovered
        self._interval = interval
        self._full_check_every = max(1, full_check_every)
        self._polls = 0
        # Set by ``request_reload``: the running loop's next poll reads at once and decides without a second look.
        self._asked = False
        self._wake = asyncio.Event()
        # The unforeseen failure whose traceback was last logged (``_unforeseen``).
        self._traced: str | None = None
        self._state: _State[T] = _State(initial, now_iso() if initial is not None else None, None, None,
                                        _Seen(source.version(initial)) if initial is not None else None)

    @property
    def value(self) -> T | None:
        return self._state.value

    @property
    def loaded_at(self) -> str | None:
        return self._state.loaded_at

    @property
    def error(self) -> str | None:
        """Why the files on disk are not in force (the last value read is), or None."""
        return self._state.error

    async def run(self) -> None:
        """Poll until cancelled. File reads and building run in a worker thread; the callbacks in the loop."""
        while True:
            asked, self._asked = self._asked, False
            try:
                self.report(await asyncio.to_thread(self._poll, settle=not asked, force=asked))
            except Exception:
                # A defect in a callback or a log hook: the next poll runs all the same (see the module's docstring).
                log.exception("filewatch.poll_failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()

    def request_reload(self) -> None:
        """Have ``run`` read the files at once and decide on what they hold without a second look (SIGHUP: the
        operator says the edit is complete). Call in the event loop's thread; one poll at a time either way."""
        self._asked = True
        self._wake.set()

    def poll(self) -> Outcome[T]:
        """One poll as ``run`` makes it every interval: a change is decided on once two polls found it alike.
        Returns what happened, for ``run`` to report (the callbacks belong to the event loop)."""
        return self._poll(settle=True)

    def reload_now(self) -> bool:
        """Check the files at once and decide on what they hold now, ignoring mtimes and without waiting for a
        second look. True if a new value was swapped in. Reports, so call it in the event loop's thread."""
        outcome = self._poll(settle=False, force=True)
        self.report(outcome)
        return isinstance(outcome, Applied)

    def report(self, outcome: Outcome[T]) -> None:
        if isinstance(outcome, Applied):
            self._on_reload(outcome.value)
        elif isinstance(outcome, Failed) and self._on_failure is not None:
            self._on_failure(outcome.error)
        elif isinstance(outcome, Recovered) and self._on_recovered is not None:
            self._on_recovered(outcome.value)

    def _poll(self, *, settle: bool, force: bool = False) -> Outcome[T]:
        self._polls += 1
        state = self._state
        # A pending change is always read again: the second look must see the content, not the file times.
        force = force or state.pending is not None or self._polls % self._full_check_every == 0
        seen, content, fingerprint = self._look(state.fingerprint, force)
        if seen is None:
            return None
        self._state = state = replace(state, fingerprint=fingerprint)
        if seen == state.decided:
            self._state = replace(state, pending=None)
            return None
        if settle and seen != state.pending:
            self._state = replace(state, pending=seen)
            return None
        self._state = state = replace(state, decided=seen, pending=None)
        if seen.unreadable is not None or content is None:
            return self._failed(seen.unreadable or "unreadable")
        try:
            value = self._source.build(content[0])
        except ConfigError as exc:
            return self._failed(str(exc))
        except Exception as exc:
            return self._failed(self._unforeseen(exc, "building"))
        current = state.value
        if current is not None and self._source.version(current) == self._source.version(value):
            # Back to what is in force (a broken edit undone, a missing file back): nothing to swap; the error is over.
            self._state = replace(state, error=None)
            if state.error is None:
                return None
            self._source.recovered(current)
            return Recovered(current)
        self._state = _State(value, now_iso(), None, fingerprint, seen)
        self._source.applied(value, current)
        return Applied(value)

    def _look(self, known: Fingerprint | None,
              force: bool) -> tuple[_Seen | None, tuple[R] | None, Fingerprint | None]:
        """What the files hold now: None when their fingerprint says nothing changed (and ``force`` is false)."""
        try:
            fingerprint = self._source.fingerprint()
            if not force and fingerprint == known:
                return None, None, known
            version, content = self._source.read()
        except ConfigError as exc:
            # Compared like a content: the same failure on the next look is a state, not a moment.
            return _Seen(None, str(exc)), None, None
        except Exception as exc:
            return _Seen(None, self._unforeseen(exc, "reading")), None, None
        self._traced = None
        return _Seen(version), (content,), fingerprint

    def _unforeseen(self, exc: Exception, doing: str) -> str:
        """The error of a failure the source did not turn into a ``ConfigError``: its class only (its message may
        quote what was read). Its traceback is logged once while it lasts (the files are looked at every second),
        for whoever fixes the source."""
        message = f"the files could not be loaded ({type(exc).__name__} while {doing} them)"
        if message != self._traced:
            self._traced = message
            log.error("filewatch.unforeseen_error", doing=doing, error=type(exc).__name__, exc_info=exc)
        return message

    def _failed(self, message: str) -> Outcome[T]:
        if message == self._state.error:
            return None
        self._source.failed(message, self._state.value)
        self._state = replace(self._state, error=message)
        return Failed(message)


def stat_files(files: Iterable[Path], what: str) -> Fingerprint:
    """The fingerprint of ``files``; ``what`` names them in the error (``policy file``, ``API key file``)."""
    entries = []
    for file in files:
        try:
            st = file.stat()
        except OSError as exc:
            raise ConfigError(f"cannot stat {what}: {exc.strerror}", source=str(file)) from None
        entries.append((str(file), st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(entries)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
