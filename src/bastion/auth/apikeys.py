"""API keys: generation, hashing and constant-time lookup. Pure: no I/O.

Why a plain SHA-256 and not bcrypt/scrypt/argon2: bastion generates keys with 256 bits of randomness, so nothing
can be guessed from a leaked hash and a slow KDF adds no protection. It would, however, make every request cost
tens of milliseconds of CPU before the caller is known, handing any anonymous client a cheap CPU exhaustion
attack. Slow KDFs are for low-entropy human passwords; these keys are not that.

Why compare against every entry: the presented key's digest is compared with ``hmac.compare_digest`` against all
entries, without stopping at the first match, so neither the comparison of one digest nor the position of the
matching entry in the table shows up in the response time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from bastion.auth.config import HASH_PREFIX, ApiKeyEntry
from bastion.principal import Principal

KEY_PREFIX = "bst_"
KEY_BYTES = 32

Compare = Callable[[bytes, bytes], bool]


def hash_key(key: str) -> str:
    """``sha256:<hex>`` of a key, the only form bastion stores."""
    return HASH_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()


def generate_key(key_id: str, groups: Iterable[str] = (),
                 attributes: Mapping[str, Any] | None = None) -> tuple[str, ApiKeyEntry]:
    """A fresh ``bst_<32 random bytes, urlsafe base64>`` key and the entry that stores its hash."""
    key = KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
    entry = ApiKeyEntry(id=key_id, hash=hash_key(key), groups=frozenset(groups),
                        attributes=MappingProxyType(dict(attributes or {})))
    return key, entry


class ApiKeyTable:
    """The configured keys. ``compare`` is ``hmac.compare_digest``; it is a parameter only so tests can observe
    that every entry is compared on every lookup.
    """

    def __init__(self, entries: Iterable[ApiKeyEntry], *, compare: Compare = hmac.compare_digest) -> None:
        self._entries = tuple((entry.digest, entry) for entry in entries)
        self._compare = compare
        # One principal per key, made once: every request with the key is the same caller, the same object.
        self._principals = {id(entry): Principal(id=entry.id, groups=entry.groups, attributes=entry.attributes,
                                                 auth_method="api_key") for _, entry in self._entries}
        self._by_id = {entry.id: entry for _, entry in self._entries}
        self._ids = frozenset(self._by_id)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def ids(self) -> frozenset[str]:
        """The principal ids the keys stand for (a key's ``id``)."""
        return self._ids

    @property
    def entries(self) -> tuple[ApiKeyEntry, ...]:
        return tuple(entry for _, entry in self._entries)

    def by_id(self, key_id: str) -> ApiKeyEntry | None:
        """The entry of the key with that ``id`` (never used to authenticate: a lookup by name, not by key)."""
        return self._by_id.get(key_id)

    def principal(self, presented: str) -> Principal | None:
        """The caller a presented key stands for, or None (``lookup``, with the same constant-time comparison)."""
        entry = self.lookup(presented)
        return None if entry is None else self._principals[id(entry)]

    def lookup(self, presented: str) -> ApiKeyEntry | None:
        digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
        found: ApiKeyEntry | None = None
        for stored, entry in self._entries:
            # No early exit: the loop does the same work whichever entry matches, or none.
            if self._compare(digest, stored):
                found = entry
        return found


class KeyRing:
    """The key table in force. The authenticator reads ``table`` on every request (each request is judged by one
    table: it takes the reference once); a reload of the key file swaps it whole (``swap``), so a removed key is
    refused from the next request on, and a key whose groups or attributes changed is the new principal.

    ``inline`` are the entries of ``auth.api_keys`` in the config file: read at start only, they are part of every
    table the key file's reloads make.
    """

    def __init__(self, table: ApiKeyTable, *, inline: tuple[ApiKeyEntry, ...] = ()) -> None:
        self.table = table
        self.inline = inline

    def swap(self, table: ApiKeyTable) -> None:
        self.table = table
