"""Hot reload: poll the policy files, swap in a new set only once it validates and has stopped changing.

Polling rather than inotify: it works the same on every platform and inside Kubernetes, where a ConfigMap update
swaps a ``..data`` symlink instead of writing the files (stat follows the links, so the change shows). A change of
mtime, size or inode triggers a content hash; every ``full_check_every`` polls the content is hashed anyway, so a
rewrite that keeps mtime and size is still seen.

A poll sees the files at one instant, and files are rarely changed in one instant: an editor moves the old file
aside before writing the new one, ``cp`` and ``git checkout`` write a file in several calls and a directory file by
file. A read in such a window finds a set that is valid but is not the one anybody wrote (a directory without its
deny file, a file cut after its allow rules). So what a poll finds is acted on only once the next poll, an interval
later, finds exactly the same (``_Seen``): a state that lasted less than an interval is never applied nor reported.
That holds for errors too (a file missing for a moment is no broken edit), and an error belongs to what was read:
reading the set in force again ends it, however the error came about. ``request_reload`` (SIGHUP) and
``reload_now`` decide at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from bastion.errors import ConfigError
from bastion.policy.decide import PolicySet
from bastion.policy.load import PolicyText, compile_policies, content_version, policy_files, read_policy_texts

log = structlog.get_logger("bastion.policy")

_Fingerprint = tuple[tuple[str, int, int, int], ...]


@dataclass(frozen=True, slots=True)
class _Seen:
    """What one poll found: the files' content hash, or why they could not be read."""

    content: str | None
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class _State:
    policy: PolicySet | None
    loaded_at: str | None
    error: str | None
    fingerprint: _Fingerprint | None
    # What was last decided on, good or bad: each bad version is reported once.
    decided: _Seen | None
    # Something else, found by the last poll and not yet decided on: the next poll decides if it finds it again.
    pending: _Seen | None = None


class PolicyWatcher:
    """Watch ``paths`` and call ``on_reload`` with every new valid policy set, ``on_failure`` with the error of
    every new broken version, and ``on_recovered`` when the files read as the set in force again after an error.

    With ``initial`` given (the set the gateway started with), only changes are reported; without it the policy
    found first is reported.
    """

    def __init__(self, paths: Sequence[Path], on_reload: Callable[[PolicySet], None], interval: float = 1.0,
                 *, initial: PolicySet | None = None, full_check_every: int = 10,
                 on_failure: Callable[[str], None] | None = None,
                 on_recovered: Callable[[PolicySet], None] | None = None) -> None:
        self._paths = list(paths)
        self._on_reload = on_reload
        self._on_failure = on_failure
        self._on_recovered = on_recovered
        self._interval = interval
        self._full_check_every = max(1, full_check_every)
        self._polls = 0
        # Set by ``request_reload``: the running loop's next poll reads at once and decides without a second look.
        self._asked = False
        self._wake = asyncio.Event()
        self._state = _State(initial, _now() if initial else None, None, None,
                             _Seen(initial.version) if initial else None)

    @property
    def policy(self) -> PolicySet | None:
        return self._state.policy

    @property
    def status(self) -> dict[str, Any]:
        """For the readiness/status endpoint: ok is False while the files on disk are broken."""
        state = self._state
        return {
            "ok": state.policy is not None and state.error is None,
            "version": state.policy.version if state.policy else None,
            "loaded_at": state.loaded_at,
            "error": state.error,
            "files": list(state.policy.files) if state.policy else [],
        }

    async def run(self) -> None:
        """Poll until cancelled. File reads and compiling run in a worker thread; the callbacks in the loop."""
        while True:
            asked, self._asked = self._asked, False
            self.report(await asyncio.to_thread(self._poll, settle=not asked, force=asked))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()

    def request_reload(self) -> None:
        """Have ``run`` read the files at once and decide on what they hold without a second look (SIGHUP: the
        operator says the edit is complete). Call in the event loop's thread; one poll at a time either way."""
        self._asked = True
        self._wake.set()

    def poll(self) -> _Outcome:
        """One poll as ``run`` makes it every interval: a change is decided on once two polls found it alike.
        Returns what happened, for ``run`` to report (the callbacks belong to the event loop)."""
        return self._poll(settle=True)

    def reload_now(self) -> bool:
        """Check the files at once and decide on what they hold now, ignoring mtimes and without waiting for a
        second look. True if a new set was swapped in. Reports, so call it in the event loop's thread."""
        outcome = self._poll(settle=False, force=True)
        self.report(outcome)
        return isinstance(outcome, PolicySet)

    def report(self, outcome: _Outcome) -> None:
        if isinstance(outcome, PolicySet):
            self._on_reload(outcome)
        elif isinstance(outcome, _Failed) and self._on_failure is not None:
            self._on_failure(outcome.error)
        elif isinstance(outcome, _Recovered) and self._on_recovered is not None:
            self._on_recovered(outcome.policy)

    def _poll(self, *, settle: bool, force: bool = False) -> _Outcome:
        self._polls += 1
        state = self._state
        # A pending change is always read again: the second look must see the content, not the file times.
        force = force or state.pending is not None or self._polls % self._full_check_every == 0
        seen, texts, fingerprint = self._look(state.fingerprint, force)
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
        if seen.unreadable is not None:
            return self._failed(seen.unreadable)
        try:
            policy = compile_policies(texts)
        except ConfigError as exc:
            return self._failed(str(exc))
        current = state.policy
        if current is not None and current.version == policy.version:
            # Back to the set in force (a broken edit undone, a missing file back): nothing to swap; the error is over.
            self._state = replace(state, error=None)
            if state.error is None:
                return None
            log.info("policy.reload_recovered", version=policy.version)
            return _Recovered(current)
        self._state = _State(policy, _now(), None, fingerprint, seen)
        log.info("policy.reloaded", version=policy.version, files=list(policy.files), rules=len(policy.rules))
        return policy

    def _look(self, known: _Fingerprint | None,
              force: bool) -> tuple[_Seen | None, list[PolicyText], _Fingerprint | None]:
        """What the files hold now: None when their fingerprint says nothing changed (and ``force`` is false)."""
        try:
            fingerprint = _fingerprint(self._paths)
            if not force and fingerprint == known:
                return None, [], known
            texts = read_policy_texts(self._paths)
        except ConfigError as exc:
            # Compared like a content: the same failure on the next look is a state, not a moment.
            return _Seen(None, str(exc)), [], None
        return _Seen(content_version(texts)), texts, fingerprint

    def _failed(self, message: str) -> _Outcome:
        if message == self._state.error:
            return None
        current = self._state.policy.version if self._state.policy else None
        log.error("policy.reload_failed", error=message, keeping_version=current)
        self._state = replace(self._state, error=message)
        return _Failed(message)


@dataclass(frozen=True, slots=True)
class _Failed:
    error: str


@dataclass(frozen=True, slots=True)
class _Recovered:
    policy: PolicySet


_Outcome = PolicySet | _Failed | _Recovered | None


def _fingerprint(paths: Sequence[Path]) -> _Fingerprint:
    entries = []
    for file in policy_files(paths):
        try:
            st = file.stat()
        except OSError as exc:
            raise ConfigError(f"cannot stat policy file: {exc.strerror}", source=str(file)) from None
        entries.append((str(file), st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(entries)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
