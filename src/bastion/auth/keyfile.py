"""Hot reload of the API key table: ``auth.api_keys_file`` as a ``bastion.filewatch.Source``, and its watcher.

Revoking a key must not wait for a restart: a leaked key would stay valid until someone restarted every replica.
So the key file (the natural home of keys in a Kubernetes Secret mounted as a file, which the kubelet updates by a
symlink swap) is watched like the policy files, by the same mechanism (``bastion.filewatch``): a change is applied
once two polls a second apart read the same entries, SIGHUP reads it at once, and a file that does not load (bad
YAML, an entry that is not an entry, a plaintext key, an id or hash twice) leaves the table in force as it is.

The table a reload makes holds the config file's own ``auth.api_keys`` too (read at start only, as the whole config
file is) followed by the file's entries, under the rules the config load applies across both.

Each outcome writes one ``api_keys.reload`` log line with its counts, never a hash: ``applied`` (keys in force,
how many were added, removed, changed), ``rejected`` (the error, and the count kept in force) and ``unchanged``
(the file reads as the table in force again after a rejection).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from bastion.auth.apikeys import ApiKeyTable
from bastion.auth.config import ApiKeyEntry, key_table_entries, parse_keys_file, read_keys_file
from bastion.errors import ConfigError
from bastion.filewatch import FileWatcher, Fingerprint, stat_files

log = structlog.get_logger("bastion.auth")

__all__ = ["KeyFile", "KeyWatcher", "table_version"]


def table_version(entries: tuple[ApiKeyEntry, ...]) -> str:
    """Equal for equal tables: a digest of the entries in order (never shown: it is derived from the hashes)."""
    text = json.dumps([entry.to_mapping() for entry in entries], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class KeyFile:
    """The key file at ``file``, read into a whole table together with the config file's ``inline`` entries.

    Reading parses, so that what two polls must agree on is the entries, not the bytes (a comment edited in is no
    reload). But only bytes not parsed before: the watcher reads the file every tenth poll even when nothing
    changed, and after every poll that found it broken, and YAML is parsed in Python, holding the interpreter
    lock: ten thousand keys took seconds of CPU each time, stalling every request the event loop was serving."""

    def __init__(self, file: Path, inline: tuple[ApiKeyEntry, ...] = ()) -> None:
        self._file = file
        self._inline = inline
        # The digest of the bytes parsed last, and what they made (the table and its version, or the error).
        self._parsed: tuple[bytes, tuple[str, ApiKeyTable] | ConfigError] | None = None

    def fingerprint(self) -> Fingerprint:
        return stat_files((self._file,), "API key file")

    def read(self) -> tuple[str, ApiKeyTable]:
        data = read_keys_file(self._file, "auth.api_keys_file")
        digest = hashlib.sha256(data).digest()
        if self._parsed is None or self._parsed[0] != digest:
            self._parsed = digest, self._parse(data)
        made = self._parsed[1]
        if isinstance(made, ConfigError):
            raise made.with_traceback(None)  # raised again each poll: without this its traceback grows each time
        return made

    def _parse(self, data: bytes) -> tuple[str, ApiKeyTable] | ConfigError:
        try:
            entries = key_table_entries(self._inline, parse_keys_file(data, self._file), self._file)
        except ConfigError as exc:
            return exc
        return table_version(entries), ApiKeyTable(entries)

    def build(self, content: ApiKeyTable) -> ApiKeyTable:
        return content

    def version(self, value: ApiKeyTable) -> str:
        return table_version(value.entries)

    def applied(self, new: ApiKeyTable, old: ApiKeyTable | None) -> None:
        log.info("api_keys.reload", outcome="applied", file=str(self._file), **self._counts(new),
                 **_changes(old.entries if old is not None else (), new.entries))

    def failed(self, error: str, current: ApiKeyTable | None) -> None:
        log.error("api_keys.reload", outcome="rejected", file=str(self._file), error=error,
                  keeping_keys=len(current) if current is not None else 0)

    def recovered(self, current: ApiKeyTable) -> None:
        log.info("api_keys.reload", outcome="unchanged", file=str(self._file), **self._counts(current))

    def _counts(self, table: ApiKeyTable) -> dict[str, int]:
        return {"keys": len(table), "inline": len(self._inline), "from_file": len(table) - len(self._inline)}


def _changes(old: tuple[ApiKeyEntry, ...], new: tuple[ApiKeyEntry, ...]) -> dict[str, int]:
    """How many ids were added, removed, and kept with another hash, groups or attributes."""
    before = {entry.id: entry for entry in old}
    after = {entry.id: entry for entry in new}
    return {"added": len(after.keys() - before.keys()), "removed": len(before.keys() - after.keys()),
            "changed": sum(1 for key, entry in after.items() if key in before and before[key] != entry)}


class KeyWatcher(FileWatcher[ApiKeyTable, ApiKeyTable]):
    """Watch the key file; see ``FileWatcher`` for the callbacks and ``initial`` (the table the ring starts
    with)."""

    def __init__(self, file: Path, on_reload: Callable[[ApiKeyTable], None], interval: float = 1.0, *,
                 inline: tuple[ApiKeyEntry, ...] = (), initial: ApiKeyTable | None = None,
                 full_check_every: int = 10, on_failure: Callable[[str], None] | None = None,
                 on_recovered: Callable[[ApiKeyTable], None] | None = None) -> None:
        super().__init__(KeyFile(file, inline), on_reload, interval, initial=initial,
                         full_check_every=full_check_every, on_failure=on_failure, on_recovered=on_recovered)

    @property
    def status(self) -> dict[str, Any]:
        """ok is False while the file on disk does not load (the table in force is the last good one)."""
        table = self.value
        return {"ok": table is not None and self.error is None, "loaded_at": self.loaded_at, "error": self.error,
                "keys": len(table) if table is not None else 0}
