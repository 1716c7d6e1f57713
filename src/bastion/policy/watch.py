"""Hot reload of the policy: the policy files as a ``bastion.filewatch.Source``, and the watcher over them.

``bastion.filewatch`` decides when (two polls that agree, errors tied to what was read, ``reload_now`` for SIGHUP);
this module says what: which files, how they compile, and the ``policy.*`` log lines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from bastion.filewatch import FileWatcher, Fingerprint, stat_files
from bastion.policy.decide import PolicySet
from bastion.policy.load import PolicyText, compile_policies, content_version, policy_files, read_policy_texts

log = structlog.get_logger("bastion.policy")


class PolicyFiles:
    """The policy files ``paths`` name (files, and directories of them), as a watched source."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths = list(paths)

    def fingerprint(self) -> Fingerprint:
        return stat_files(policy_files(self._paths), "policy file")

    def read(self) -> tuple[str, list[PolicyText]]:
        texts = read_policy_texts(self._paths)
        return content_version(texts), texts

    def build(self, content: list[PolicyText]) -> PolicySet:
        return compile_policies(content)

    def version(self, value: PolicySet) -> str:
        return value.version

    def applied(self, new: PolicySet, old: PolicySet | None) -> None:
        log.info("policy.reloaded", version=new.version, files=list(new.files), rules=len(new.rules))

    def failed(self, error: str, current: PolicySet | None) -> None:
        log.error("policy.reload_failed", error=error, keeping_version=current.version if current else None)

    def recovered(self, current: PolicySet) -> None:
        log.info("policy.reload_recovered", version=current.version)


class PolicyWatcher(FileWatcher[PolicySet, list[PolicyText]]):
    """Watch the policy files ``paths``; see ``FileWatcher`` for the callbacks and ``initial``."""

    def __init__(self, paths: Sequence[Path], on_reload: Callable[[PolicySet], None], interval: float = 1.0,
                 *, initial: PolicySet | None = None, full_check_every: int = 10,
                 on_failure: Callable[[str], None] | None = None,
                 on_recovered: Callable[[PolicySet], None] | None = None) -> None:
        super().__init__(PolicyFiles(paths), on_reload, interval, initial=initial, full_check_every=full_check_every,
                         on_failure=on_failure, on_recovered=on_recovered)

    @property
    def policy(self) -> PolicySet | None:
        return self.value

    @property
    def status(self) -> dict[str, Any]:
        """For the readiness/status endpoint: ok is False while the files on disk are broken."""
        policy = self.value
        return {
            "ok": policy is not None and self.error is None,
            "version": policy.version if policy else None,
            "loaded_at": self.loaded_at,
            "error": self.error,
            "files": list(policy.files) if policy else [],
        }
