"""Hot reload: poll the policy files, swap in a new set only once it validates.

Polling rather than inotify: it works the same on every platform and inside Kubernetes, where a ConfigMap update
swaps a ``..data`` symlink instead of writing the files (stat follows the links, so the change shows). A change of
mtime, size or inode triggers a content hash; every ``full_check_every`` polls the content is hashed anyway, so a
rewrite that keeps mtime and size is still seen. A broken edit keeps the last good set in force and is logged at
error level on every new broken version, and the status shows it until it is fixed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from bastion.errors import ConfigError
from bastion.policy.decide import PolicySet
from bastion.policy.load import compile_policies, content_version, policy_files, read_policy_texts

log = structlog.get_logger("bastion.policy")

_Fingerprint = tuple[tuple[str, int, int, int], ...]


@dataclass(frozen=True, slots=True)
class _State:
    policy: PolicySet | None
    loaded_at: str | None
    error: str | None
    fingerprint: _Fingerprint | None
    content_hash: str | None  # of the last content tried, good or bad: each bad version is reported once


class PolicyWatcher:
    """Watch ``paths`` and call ``on_reload`` with every new valid policy set (``on_failure`` with the error of
    every new broken version).

    With ``initial`` given (the set the gateway started with), only changes are reported; without it the first
    poll loads and reports the current files.
    """

    def __init__(self, paths: Sequence[Path], on_reload: Callable[[PolicySet], None], interval: float = 1.0,
                 *, initial: PolicySet | None = None, full_check_every: int = 10,
                 on_failure: Callable[[str], None] | None = None) -> None:
        self._paths = list(paths)
        self._on_reload = on_reload
        self._on_failure = on_failure
        self._interval = interval
        self._full_check_every = max(1, full_check_every)
        self._polls = 0
        self._state = _State(initial, _now() if initial else None, None, None, initial.version if initial else None)

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
        """Poll until cancelled. File reads and compiling run in a worker thread; ``on_reload`` in the loop."""
        while True:
            before = self._state.error
            new = await asyncio.to_thread(self._poll)
            if new is not None:
                self._on_reload(new)
            elif self._on_failure is not None and self._state.error and self._state.error != before:
                # Reported once per broken version, in the loop (the poll itself ran in a worker thread).
                self._on_failure(self._state.error)
            await asyncio.sleep(self._interval)

    def reload_now(self) -> bool:
        """Check the files at once, ignoring mtimes. True if a new set was swapped in (and reported)."""
        new = self._poll(force=True)
        if new is not None:
            self._on_reload(new)
        return new is not None

    def _poll(self, force: bool = False) -> PolicySet | None:
        self._polls += 1
        force = force or self._polls % self._full_check_every == 0
        try:
            fingerprint = _fingerprint(self._paths)
            if not force and fingerprint == self._state.fingerprint:
                return None
            self._state = replace(self._state, fingerprint=fingerprint)
            texts = read_policy_texts(self._paths)
            content = content_version(texts)
            if content == self._state.content_hash:
                return None
            self._state = replace(self._state, content_hash=content)
            policy = compile_policies(texts)
        except ConfigError as exc:
            self._failed(str(exc))
            return None
        current = self._state.policy
        if current is not None and current.version == policy.version:
            # Back to the set in force (a broken edit undone): nothing to swap, but the error is over.
            log.info("policy.reload_recovered", version=policy.version)
            self._state = replace(self._state, error=None)
            return None
        self._state = _State(policy, _now(), None, self._state.fingerprint, self._state.content_hash)
        log.info("policy.reloaded", version=policy.version, files=list(policy.files), rules=len(policy.rules))
        return policy

    def _failed(self, message: str) -> None:
        if message != self._state.error:
            current = self._state.policy.version if self._state.policy else None
            log.error("policy.reload_failed", error=message, keeping_version=current)
        self._state = replace(self._state, error=message)


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
