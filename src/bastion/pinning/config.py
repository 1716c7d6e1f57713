"""The ``pinning:`` config section.

.. code-block:: yaml

    pinning:
      enabled: true                 # default true
      store: redis                  # file | redis; default: redis when the gateway has redis configured, else file
      file: var/pins.json           # the file store's path (default var/pins.json)
      trusted_upstreams: [internal] # changes on these are approved at once (still audited as drift)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from bastion.errors import ConfigError

StoreKind = Literal["file", "redis"]
DEFAULT_FILE = Path("var/pins.json")
_KEYS = frozenset({"enabled", "store", "file", "trusted_upstreams"})


@dataclass(frozen=True, slots=True)
class PinningConfig:
    enabled: bool = True
    store: StoreKind | None = None
    file: Path = DEFAULT_FILE
    trusted_upstreams: frozenset[str] = frozenset()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, path: str = "pinning") -> PinningConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", path=path)
        unknown = sorted(set(data) - _KEYS, key=str)
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r}; expected one of {', '.join(sorted(_KEYS))}",
                              path=f"{path}.{unknown[0]}")
        enabled = data.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError("expected true or false", path=f"{path}.enabled")
        store = data.get("store")
        if store is not None and store not in ("file", "redis"):
            raise ConfigError("expected 'file' or 'redis'", path=f"{path}.store")
        file = data.get("file", str(DEFAULT_FILE))
        if not isinstance(file, str) or not file:
            raise ConfigError("expected a file path", path=f"{path}.file")
        trusted = data.get("trusted_upstreams", [])
        if not isinstance(trusted, list) or not all(isinstance(t, str) and t for t in trusted):
            raise ConfigError("expected a list of upstream names", path=f"{path}.trusted_upstreams")
        return cls(enabled=enabled, store=store, file=Path(file), trusted_upstreams=frozenset(trusted))

    def with_trusted(self, upstreams: Iterable[str]) -> PinningConfig:
        """Add upstreams marked ``trusted: true`` in their own config section."""
        return replace(self, trusted_upstreams=self.trusted_upstreams | frozenset(upstreams))

    def store_kind(self, *, have_redis: bool, path: str = "pinning") -> StoreKind:
        """The store to use; ``store: redis`` without a Redis configured is a config error."""
        if self.store == "redis" and not have_redis:
            raise ConfigError("store 'redis' needs a top-level 'redis' section", path=f"{path}.store")
        return self.store or ("redis" if have_redis else "file")

    def is_trusted(self, upstream: str) -> bool:
        return upstream in self.trusted_upstreams
