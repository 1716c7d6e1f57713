from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from bastion.pinning import FilePinStore, Pin, Pinning, PinningConfig, PinStoreCorrupt, PinStoreUnavailable
from tests.pinning.tools import POISONED, list_dir, read_file


@dataclass(frozen=True)
class Put:
    writes: Mapping[str, Pin]


def pin(tool: str) -> Pin:
    return Pin(tool=tool, fingerprint="sha256:" + tool, definition={"name": tool}, status="approved",
               first_seen="t", approved_by="x", approved_at="t")


async def test_round_trip_and_file_shape(tmp_path: Path) -> None:
    store = FilePinStore(tmp_path / "sub" / "pins.json")
    assert await store.load("files") == {}
    await store.update("files", lambda pins: Put({"a": pin("a")}))
    await store.update("web", lambda pins: Put({"b": pin("b")}))
    assert await store.load("files") == {"a": pin("a")}
    assert await store.load_all() == {"files": {"a": pin("a")}, "web": {"b": pin("b")}}
    doc = json.loads((tmp_path / "sub" / "pins.json").read_text())
    assert doc == {"version": 1, "upstreams": {"files": {"a": pin("a").to_json()}, "web": {"b": pin("b").to_json()}}}
    # Nothing left behind but the file and its lock.
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["pins.json", "pins.json.lock"]


async def test_concurrent_writers_keep_a_valid_file_and_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    # Two stores on one file stand for the gateway and the admin CLI: separate asyncio locks, so only the file
    # lock keeps their read-modify-writes from overwriting each other.
    stores = [FilePinStore(path), FilePinStore(path)]
    done = asyncio.Event()
    reads = 0

    async def reader() -> None:
        nonlocal reads
        while not done.is_set():
            if path.exists():
                json.loads(path.read_text())  # never half a file
                reads += 1
            await asyncio.sleep(0)

    def adding(tool: str) -> Callable[[Mapping[str, Pin]], Put]:
        return lambda pins: Put({tool: pin(tool)})

    reading = asyncio.create_task(reader())
    await asyncio.gather(*(stores[i % 2].update("shared", adding(f"t{i}")) for i in range(60)),
                         *(stores[i % 2].update(f"up{i % 3}", adding(f"u{i}")) for i in range(30)))
    done.set()
    await reading
    assert reads > 0
    everything = await FilePinStore(path).load_all()
    assert set(everything["shared"]) == {f"t{i}" for i in range(60)}
    assert sum(len(everything[f"up{k}"]) for k in range(3)) == 30


async def test_corrupt_file_is_an_error_and_reconcile_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    path.write_text("{not json")
    store = FilePinStore(path)
    with pytest.raises(PinStoreCorrupt):
        await store.load("files")
    outcome = await Pinning(store, PinningConfig()).reconcile("files", [read_file(), list_dir()])
    assert outcome.degraded
    assert outcome.quarantined == {"read_file", "list_dir"}
    path.write_text(json.dumps({"version": 1, "upstreams": {"files": {"read_file": {"status": "approved"}}}}))
    with pytest.raises(PinStoreCorrupt, match="fingerprint"):
        await store.load("files")
    path.write_text("[]")
    with pytest.raises(PinStoreCorrupt):
        await store.load_all()


async def test_unwritable_location_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    store = FilePinStore(tmp_path / "file" / "pins.json")
    with pytest.raises(PinStoreUnavailable):
        await store.update("files", lambda pins: Put({"a": pin("a")}))
    outcome = await Pinning(store, PinningConfig()).reconcile("files", [read_file(POISONED)])
    assert (outcome.degraded, outcome.quarantined) == (True, frozenset({"read_file"}))


async def test_the_file_is_the_stdlib_encoding_whatever_was_remembered(tmp_path: Path) -> None:
    """Sections of unchanged upstreams are reused between writes; the file still reads as one ``json.dumps``."""
    path = tmp_path / "pins.json"
    store = FilePinStore(path)
    odd = Pin(tool="odd", fingerprint="sha256:1", definition={"name": "odd", "x": [1e-05, 2**70, "é\u2028"]},
              status="approved", first_seen="t", approved_by="x", approved_at="t")
    for i in range(4):
        await store.update(f"up{i % 2}", lambda pins, i=i: Put({f"t{i}": pin(f"t{i}"), "odd": odd}))
        doc = json.loads(path.read_text())
        assert path.read_text() == json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert sorted(doc["upstreams"]["up0"]) == ["odd", "t0", "t2"]


async def test_another_writers_change_is_read_even_when_the_file_was_remembered(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    gateway, cli = FilePinStore(path), FilePinStore(path)
    await gateway.update("files", lambda pins: Put({"a": pin("a")}))
    assert await gateway.load("files") == {"a": pin("a")}  # now remembered
    await cli.update("files", lambda pins: Put({"b": pin("b")}))
    assert await gateway.load("files") == {"a": pin("a"), "b": pin("b")}
    # A read-modify-write on top of the other writer's change keeps it.
    await gateway.update("files", lambda pins: Put({"c": pin("c")}))
    assert set(await cli.load("files")) == {"a", "b", "c"}
    # Same length, same shape, other bytes: still seen.
    text = path.read_text()
    path.write_text(text.replace('"sha256:a"', '"sha256:A"'))
    assert (await gateway.load("files"))["a"].fingerprint == "sha256:A"
