"""Where pins live: a JSON file (one gateway) or Redis (shared by replicas), behind one small protocol.

Every write is a read-modify-write of one upstream's pins, done atomically so two replicas (or a replica and the
admin CLI) reconciling or approving at once cannot lose each other's changes: the file store holds an exclusive
``flock`` on a side lock file, the Redis store uses WATCH/MULTI and retries on conflict. The ``plan`` callback is
pure and may run more than once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
import structlog

from bastion.pinning import encoding
from bastion.pinning.config import PinningConfig
from bastion.pinning.errors import PinStoreCorrupt, PinStoreUnavailable
from bastion.pinning.model import Pin, PinDataError

log = structlog.get_logger("bastion.pinning")

DEFAULT_KEY_PREFIX = "bastion:pins:"
_FILE_VERSION = 1
_MAX_ATTEMPTS = 16
# Own writes the watcher can still be behind on: one per upstream per rebuild, and it looks four times a second.
_OWN_KEPT = 256

# What the file watcher compares between polls: (mtime, size, inode); a replacement by rename changes the inode.
FileIdentity = tuple[int, int, int]


def file_identity(path: Path) -> FileIdentity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class PinWrites(Protocol):
    @property
    def writes(self) -> Mapping[str, Pin]: ...


W = TypeVar("W", bound=PinWrites)
T = TypeVar("T")


class PinStore(Protocol):
    async def load(self, upstream: str) -> dict[str, Pin]:
        """The pins of one upstream, by tool name."""

    async def load_all(self) -> dict[str, dict[str, Pin]]:
        """Every upstream's pins."""

    async def update(self, upstream: str, plan: Callable[[Mapping[str, Pin]], W]) -> W:
        """Atomically read ``upstream``'s pins, call ``plan`` on them and store its ``writes``; return its result."""

    async def announce(self, upstream: str) -> None:
        """Tell running gateways that an admin changed ``upstream``'s pins (see ``bastion.pinning.watch``)."""

    async def close(self) -> None: ...


def _decode_pins(raw: Mapping[str, Any], where: str) -> dict[str, Pin]:
    try:
        return {tool: Pin.from_json(tool, data) for tool, data in raw.items()}
    except PinDataError as exc:
        raise PinStoreCorrupt(f"{where}: {exc}") from None


class FilePinStore:
    """Pins in one JSON file: ``{"version": 1, "upstreams": {upstream: {tool: pin}}}``.

    Written to a temporary file in the same directory and renamed over the old one, so a reader (another process,
    or ``load`` here, which takes no lock) sees the old file or the new one, never half of one.

    A catalogue refresh reconciles every upstream in turn, each a read-modify-write of the whole file, so with many
    upstreams the file would be parsed and re-encoded once per upstream: quadratic in the fleet. Two memories keep
    that linear without trusting anything but the file's bytes: the last document read or written, reused only
    while the file holds exactly the bytes it came from (another writer's change is always seen), and each
    upstream's encoded section, reused while that upstream's pins are the very same object (unchanged since).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._lock = asyncio.Lock()
        # For the watcher (``bastion.pinning.watch``), which must not rebuild the catalogue for this gateway's own
        # reconcile writes (at a first start that is one write per upstream, each worth a full rebuild): the
        # identities of the files this store wrote while nothing else had written since its previous locked read
        # or write, so the view built from its reads already holds everything in them. Tuples replaced whole:
        # written from worker threads, read on the event loop.
        self._own: tuple[FileIdentity, ...] = ()
        self._last_seen: FileIdentity | None = None
        self._accessed = False
        # (file bytes, parsed document): the document is never mutated, so it can be handed out again. Replaced
        # whole (one attribute store), since ``load`` may read it from another thread.
        self._parsed: tuple[bytes, dict[str, Any]] | None = None
        self._sections: dict[str, tuple[object, bytes]] = {}

    async def load(self, upstream: str) -> dict[str, Pin]:
        doc = await asyncio.to_thread(self._read)
        return _decode_pins(doc["upstreams"].get(upstream, {}), str(self.path))

    async def load_all(self) -> dict[str, dict[str, Pin]]:
        doc = await asyncio.to_thread(self._read)
        return {up: _decode_pins(pins, str(self.path)) for up, pins in doc["upstreams"].items()}

    async def update(self, upstream: str, plan: Callable[[Mapping[str, Pin]], W]) -> W:
        # The asyncio lock keeps this process's writers from piling up threads on the flock.
        async with self._lock:
            return await asyncio.to_thread(self._update, upstream, plan)

    async def announce(self, upstream: str) -> None:
        # Nothing to send: gateways watch the file itself, so the write is the announcement.
        return None

    async def close(self) -> None:
        return None

    def wrote(self, identity: FileIdentity | None) -> bool:
        """Whether the file with this identity is one of this store's own recent writes, with no other writer's
        change since this store last read the file (so a rebuild would read nothing new)."""
        return identity is not None and identity in self._own

    def _update(self, upstream: str, plan: Callable[[Mapping[str, Pin]], W]) -> W:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self._lock_path, "a+b") as lock_file:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
                before = file_identity(self.path)
                # Nothing written by anyone else since this store's previous read or write (or this is its first):
                # whatever this write leaves holds nothing this process has not read.
                continuous = not self._accessed or before == self._last_seen
                self._accessed = True
                self._last_seen = before
                doc = self._read()
                result = plan(_decode_pins(doc["upstreams"].get(upstream, {}), str(self.path)))
                if result.writes:
                    pins = dict(doc["upstreams"].get(upstream, {}))
                    pins.update({tool: pin.to_json() for tool, pin in result.writes.items()})
                    # A new document sharing the unchanged parts: the one read may be the remembered one.
                    self._last_seen = self._write({**doc, "upstreams": {**doc["upstreams"], upstream: pins}},
                                                  own=continuous)
                return result
        except OSError as exc:
            raise PinStoreUnavailable(f"pin file {self.path}: {exc.strerror or exc}") from None

    def _read(self) -> dict[str, Any]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {"version": _FILE_VERSION, "upstreams": {}}
        except OSError as exc:
            raise PinStoreUnavailable(f"pin file {self.path}: {exc.strerror or exc}") from None
        parsed = self._parsed
        if parsed is not None and parsed[0] == raw:
            return parsed[1]
        text = raw.decode("utf-8")
        try:
            doc = json.loads(text)
        except ValueError:
            raise PinStoreCorrupt(f"pin file {self.path}: not valid JSON") from None
        if (not isinstance(doc, dict) or doc.get("version") != _FILE_VERSION
                or not isinstance(doc.get("upstreams"), dict)
                or not all(isinstance(v, dict) for v in doc["upstreams"].values())):
            raise PinStoreCorrupt(f"pin file {self.path}: expected {{'version': 1, 'upstreams': {{...}}}}")
        self._parsed = (raw, doc)
        return doc

    def _write(self, doc: dict[str, Any], *, own: bool) -> FileIdentity:
        """Write ``doc`` over the file; its identity. With ``own``, remembered as this store's own write before
        the rename (a rename keeps mtime, size and inode), so the watcher never sees it unannounced."""
        data = self._encode(doc)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                st = os.fstat(f.fileno())
            identity = (st.st_mtime_ns, st.st_size, st.st_ino)
            if own:
                self._own = (*self._own[-(_OWN_KEPT - 1):], identity)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._parsed = (data, doc)
        return identity

    def _encode(self, doc: Mapping[str, Any]) -> bytes:
        """``json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False)`` and a newline, as UTF-8, byte for
        byte, with each upstream's section encoded only when its pins changed. Nested output is the standalone
        encoding with every line indented further (JSON strings never hold a raw newline), which is what makes
        the sections reusable; the pieces are joined once, since the file may be megabytes."""
        sections: dict[str, tuple[object, bytes]] = {}
        pieces: list[bytes] = []
        for i, (key, value) in enumerate(sorted(doc.items())):
            pieces.append(b"{\n  " if i == 0 else b",\n  ")
            pieces.append(_dumps(key).encode("utf-8") + b": ")
            if key == "upstreams" and value:
                for j, (name, pins) in enumerate(sorted(value.items())):
                    cached = self._sections.get(name)
                    section = cached[1] if cached is not None and cached[0] is pins else \
                        (_dumps(name) + ": " + _indented(pins, 4)).encode("utf-8")
                    sections[name] = (pins, section)
                    pieces.append(b"{\n    " if j == 0 else b",\n    ")
                    pieces.append(section)
                pieces.append(b"\n  }")
            else:
                pieces.append(_indented(value, 2).encode("utf-8"))
        pieces.append(b"\n}\n" if pieces else b"{}\n")
        self._sections = sections
        return b"".join(pieces)


def _dumps(value: Any) -> str:
    return encoding.indented(value)


def _indented(value: Any, by: int) -> str:
    return _dumps(value).replace("\n", "\n" + " " * by)


class RedisPinStore:
    """Pins in Redis, one hash per upstream: ``<prefix><upstream>``, field = tool name, value = the pin's JSON.

    ``timeout_s`` bounds every operation, so a hung Redis counts as down (and tools are quarantined) instead of
    stalling a catalogue refresh. The client is the gateway's shared one unless ``owns_client`` (the CLI's own).
    """

    def __init__(self, client: aioredis.Redis, *, key_prefix: str = DEFAULT_KEY_PREFIX,
                 timeout_s: float = 5.0, owns_client: bool = False) -> None:
        self._client = client
        self._owns_client = owns_client
        self._prefix = key_prefix
        self._timeout_s = timeout_s

    def key(self, upstream: str) -> str:
        return self._prefix + upstream

    @property
    def client(self) -> aioredis.Redis:
        return self._client

    @property
    def channel(self) -> str:
        """The pub/sub channel admin decisions are announced on (channels and keys are separate namespaces)."""
        return self._prefix + "~changed"

    async def announce(self, upstream: str) -> None:
        await self._guard(self._client.publish(self.channel, upstream))

    async def load(self, upstream: str) -> dict[str, Pin]:
        key = self.key(upstream)
        raw = await self._guard(self._client.hgetall(key))
        return _decode_hash(raw, key)

    async def load_all(self) -> dict[str, dict[str, Pin]]:
        async def scan() -> dict[str, dict[str, Pin]]:
            out: dict[str, dict[str, Pin]] = {}
            async for key in self._client.scan_iter(match=_glob_escape(self._prefix) + "*", count=200):
                name = _text(key)
                out[name[len(self._prefix):]] = _decode_hash(await self._client.hgetall(name), name)
            return out

        return await self._guard(scan())

    async def update(self, upstream: str, plan: Callable[[Mapping[str, Pin]], W]) -> W:
        key = self.key(upstream)

        async def transact() -> W:
            async with self._client.pipeline(transaction=True) as pipe:
                for _ in range(_MAX_ATTEMPTS):
                    try:
                        await pipe.watch(key)
                        result = plan(_decode_hash(await pipe.hgetall(key), key))
                        if not result.writes:
                            await pipe.unwatch()  # type: ignore[no-untyped-call]
                            return result
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.hset(key, mapping={tool: json.dumps(pin.to_json(), sort_keys=True, ensure_ascii=False)
                                                for tool, pin in result.writes.items()})
                        await pipe.execute()
                        return result
                    except redis_errors.WatchError:
                        continue
            raise PinStoreUnavailable(f"pins of {upstream!r}: too many concurrent writers, gave up")

        return await self._guard(transact())

    async def close(self) -> None:
        if self._owns_client:
            await self._guard(self._client.aclose())

    async def _guard(self, op: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await op
        except TimeoutError:
            raise PinStoreUnavailable(f"redis did not answer within {self._timeout_s:g} s") from None
        except (redis_errors.RedisError, OSError) as exc:
            raise PinStoreUnavailable(f"redis error: {type(exc).__name__}") from None


def _decode_hash(raw: Mapping[Any, Any], key: str) -> dict[str, Pin]:
    try:
        return {_text(f): Pin.from_json(_text(f), json.loads(_text(v))) for f, v in raw.items()}
    except (PinDataError, ValueError) as exc:
        raise PinStoreCorrupt(f"redis key {key}: {exc}") from None


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def open_store(cfg: PinningConfig, redis_client: aioredis.Redis | None, *,
               key_prefix: str = DEFAULT_KEY_PREFIX) -> PinStore:
    """The store ``cfg`` asks for, on the gateway's Redis client when it has one."""
    if cfg.store_kind(have_redis=redis_client is not None) == "redis":
        assert redis_client is not None
        return RedisPinStore(redis_client, key_prefix=key_prefix)
    return FilePinStore(cfg.file)
