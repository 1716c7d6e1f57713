"""Through the running gateway: the API key file is re-read while it runs (``auth.keyfile``). A key removed from it
is refused from the next request on, and whatever it opened (a session's GET stream, the session itself, a
2026-07-28 listen stream) ends; a key whose groups changed is judged with the new ones; a broken file leaves the
table in force and says so until it is fixed; SIGHUP reads the file at once.

The key file is updated the way the kubelet updates a mounted Secret: the files live in a timestamped directory,
reached through a ``..data`` symlink that is swapped in one rename.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from bastion.auth.apikeys import hash_key
from tests.e2e.conftest import stdio_upstream
from tests.e2e.test_session_ends import ListenStream, Stream, bearer, modern_call
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient

ALICE = "bst_alice_" + "a" * 40
BOB = "bst_bob___" + "b" * 40
CAROL = "bst_carol_" + "c" * 40
POLICY = """version: 1
rules:
  - id: echo-for-eng
    effect: allow
    tools: [basic__echo]
    principals: {groups: [eng]}
  - id: grow-for-all
    effect: allow
    tools: [basic__grow]
"""


def entry(key_id: str, key: str, groups: list[str]) -> dict[str, Any]:
    return {"id": key_id, "hash": hash_key(key), "groups": groups}


class Secret:
    """A directory as the kubelet mounts a Secret: ``keys.yaml -> ..data/keys.yaml``, ``..data -> ..<n>``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self._n = 0
        self.swap("api_keys: []\n")
        (root / "keys.yaml").symlink_to("..data/keys.yaml")

    @property
    def file(self) -> Path:
        return self.root / "keys.yaml"

    def swap(self, text: str) -> None:
        self.swap_bytes(text.encode())

    def swap_bytes(self, data: bytes) -> None:
        self._swap(lambda file: file.write_bytes(data))

    def swap_fifo(self) -> None:
        self._swap(os.mkfifo)

    def _swap(self, make: Callable[[Path], object]) -> None:
        self._n += 1
        version = self.root / f"..{self._n}"
        version.mkdir()
        make(version / "keys.yaml")
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.root / "..data")

    def keys(self, *entries: dict[str, Any]) -> None:
        self.swap(yaml.safe_dump({"api_keys": list(entries)}))


@pytest.fixture
def secret(tmp_path: Path) -> Secret:
    secret = Secret(tmp_path / "secret")
    secret.keys(entry("alice", ALICE, ["eng"]), entry("bob", BOB, ["eng"]))
    return secret


@pytest.fixture
def gw(tmp_path: Path, secret: Secret) -> Iterator[GatewayProcess]:
    (tmp_path / "policy.yaml").write_text(POLICY)
    # Every stream ticks every 15 s (the default; a GET stream ticks at half an idle timeout shorter than 30 s).
    gateway = GatewayProcess({"auth": {"api_keys_file": str(secret.file)}, "policies": str(tmp_path / "policy.yaml"),
                              "upstreams": {"basic": stdio_upstream()}, "sessions": {"idle_timeout": "10m"}},
                             tmp_path).start()
    yield gateway
    gateway.stop()


def logs(gw: GatewayProcess, event: str) -> list[dict[str, Any]]:
    out = []
    for line in gw.stderr().splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            if doc.get("event") == event:
                out.append(doc)
    return out


def until(condition: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def reloads(gw: GatewayProcess, outcome: str) -> list[dict[str, Any]]:
    return [doc for doc in logs(gw, "api_keys.reload") if doc["outcome"] == outcome]


def key_status(gw: GatewayProcess) -> dict[str, Any]:
    status: dict[str, Any] = httpx.get(gw.base + "/readyz", timeout=5).json()["checks"]["api_keys"]
    return status


def failing_gauge(gw: GatewayProcess) -> float:
    body = httpx.get(gw.base + "/metrics", timeout=5).text
    return next(float(line.split()[-1]) for line in body.splitlines()
                if line.startswith("bastion_api_keys_reload_failing "))


def test_a_key_removed_from_the_file_is_refused_at_once_and_ends_what_it_opened(gw: GatewayProcess,
                                                                                secret: Secret) -> None:
    client = RpcClient(gw.url, bearer(ALICE))
    client.initialize()
    get_stream = Stream(gw.url, client.session_id or "", bearer(ALICE))
    listen = ListenStream(gw.url, bearer(ALICE))
    try:
        assert modern_call(gw.url, ALICE, "basic__echo").status_code == 200
        secret.keys(entry("bob", BOB, ["eng"]))
        until(lambda: reloads(gw, "applied"), "the removal was never applied")
        # From the next request on: no grace period, no cache keeping the key alive.
        assert modern_call(gw.url, ALICE, "basic__echo").status_code == 401
        assert client.post({"jsonrpc": "2.0", "id": 5, "method": "ping"}).status_code == 401
        assert modern_call(gw.url, BOB, "basic__echo").status_code == 200
        # Woken by the reload, not left to their next tick (15 s away at most, so a bound under it tells).
        assert get_stream.wait_end(10), "the GET stream outlived the removal of its key"
        assert listen.wait_end(10), "the listen stream outlived the removal of its key"
        # The session the key held a stream of ended with it, as a revoked JWT's does.
        ends = gw.wait_records("session.end", 1)
        assert [(r["session"], r["reason"], r["principal"]["id"]) for r in ends] == \
            [(client.session_id, "revoked", "alice")]
        failures = [r for r in gw.wait_records("auth.failure", 4) if r["principal"] is not None]
        assert sorted((r["era"], r["session"], r["principal"]["id"]) for r in failures) == \
            [("legacy", client.session_id, "alice"), ("modern", None, "alice")]
        [applied] = reloads(gw, "applied")
        assert (applied["keys"], applied["added"], applied["removed"], applied["changed"]) == (1, 0, 1, 0)
        assert applied["level"] == "info"
        assert "sha256:" not in gw.stderr()
    finally:
        get_stream.close()
        listen.close()
        client.close()


async def test_a_key_whose_groups_changed_is_judged_with_the_new_ones(gw: GatewayProcess, secret: Secret) -> None:
    http = create_mcp_http_client(headers=bearer(ALICE))
    async with http, Client(streamable_http_client(gw.url, http_client=http), mode="legacy") as client:
        assert (await client.call_tool("basic__echo", {"message": "as eng"})).content[0].text == "as eng"
        secret.keys(entry("alice", ALICE, []), entry("bob", BOB, ["eng"]))
        until(lambda: reloads(gw, "applied"), "the change was never applied")
        # The same session, the next call: alice is no longer in eng, and eng alone may echo (a tool the caller
        # may not call is one it does not see).
        with pytest.raises(Exception, match="Unknown tool: basic__echo"):
            await client.call_tool("basic__echo", {"message": "as nobody"})
        assert (await client.call_tool("basic__grow", {})).is_error is False
    [applied] = reloads(gw, "applied")
    assert (applied["added"], applied["removed"], applied["changed"]) == (0, 0, 1)
    echoes = [r for r in gw.records("tool.call") if r["tool"]["name"] == "basic__echo"]
    assert [(r["principal"]["groups"], r["decision"]) for r in echoes] == [(["eng"], "allow"), ([], "deny")]


def test_a_broken_key_file_keeps_the_table_in_force_until_it_is_fixed(gw: GatewayProcess, secret: Secret) -> None:
    assert key_status(gw)["ok"] is True and failing_gauge(gw) == 0
    # Alice's removal, in a file that does not load: a plaintext key where a hash belongs.
    secret.swap(yaml.safe_dump({"api_keys": [{"id": "bob", "hash": hash_key(BOB)}, {"id": "carol", "key": CAROL}]}))
    until(lambda: reloads(gw, "rejected"), "the broken file was never reported")
    [rejected] = reloads(gw, "rejected")
    assert rejected["level"] == "error" and rejected["keeping_keys"] == 2
    assert rejected["error"] == f"{secret.file} [api_keys[1].key]: 'key' looks like a plaintext key; config holds " \
                               "only hashes: replace it with 'hash: sha256:...' (see 'bastion keys hash')"
    assert CAROL not in gw.stderr()
    status = key_status(gw)
    assert status["ok"] is False and "last good key table is in force" in status["error"]
    assert failing_gauge(gw) == 1
    # The previous table is in force: alice still gets in, carol does not.
    assert modern_call(gw.url, ALICE, "basic__echo").status_code == 200
    assert modern_call(gw.url, CAROL, "basic__echo").status_code == 401

    secret.keys(entry("bob", BOB, ["eng"]), entry("carol", CAROL, ["eng"]))
    until(lambda: reloads(gw, "applied"), "the fixed file was never applied")
    assert modern_call(gw.url, ALICE, "basic__echo").status_code == 401
    assert modern_call(gw.url, CAROL, "basic__echo").status_code == 200
    assert key_status(gw) == {"ok": True, "loaded_at": key_status(gw)["loaded_at"], "error": None}
    assert failing_gauge(gw) == 0


def test_a_key_file_that_is_not_text_is_rejected_and_later_removals_still_apply(gw: GatewayProcess,
                                                                               secret: Secret) -> None:
    # A write cut inside a UTF-8 character: the loader's UnicodeDecodeError used to end the watcher for good, so
    # the removal below was never applied (alice kept getting in) while /readyz said the key file was fine.
    good = yaml.safe_dump({"api_keys": [entry("alice", ALICE, ["eng"]), entry("bob", BOB, ["eng"])]})
    secret.swap_bytes(good.encode() + b"# caf\xc3")
    until(lambda: reloads(gw, "rejected"), "the broken file was never reported")
    [rejected] = reloads(gw, "rejected")
    assert rejected["error"] == f"{secret.file}: keys file is not valid UTF-8"
    assert key_status(gw)["ok"] is False and failing_gauge(gw) == 1
    secret.keys(entry("bob", BOB, ["eng"]))
    until(lambda: reloads(gw, "applied"), "the watcher stopped: the removal was never applied")
    assert modern_call(gw.url, ALICE, "basic__echo").status_code == 401
    assert key_status(gw)["ok"] is True and failing_gauge(gw) == 0


def test_a_fifo_in_place_of_the_key_file_is_rejected_and_neither_reloads_nor_shutdown_hang(
        gw: GatewayProcess, secret: Secret) -> None:
    # The watcher's read of a FIFO blocked for ever: no later removal was applied, /readyz said ok, and SIGTERM
    # left the process waiting for the stuck thread until it was killed.
    secret.swap_fifo()
    until(lambda: reloads(gw, "rejected"), "the FIFO was never reported")
    assert reloads(gw, "rejected")[0]["error"].endswith("cannot read keys file: not a regular file but a FIFO")
    assert key_status(gw)["ok"] is False
    secret.keys(entry("bob", BOB, ["eng"]))
    until(lambda: reloads(gw, "applied"), "the removal was never applied")
    assert modern_call(gw.url, ALICE, "basic__echo").status_code == 401
    assert gw.stop() == 0


def test_sighup_reads_the_key_file_at_once(gw: GatewayProcess, secret: Secret) -> None:
    # Rewritten in place with the same size, inode and mtime: nothing a poll's stat sees, so only SIGHUP (or the
    # full read every tenth poll) can find it.
    real = secret.file.resolve()
    before = real.stat()
    text = real.read_text()
    changed = text.replace(hash_key(ALICE), hash_key(CAROL))
    assert len(changed) == len(text) and changed != text
    with real.open("r+") as f:
        f.write(changed)
    os.utime(real, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert real.stat().st_ino == before.st_ino and real.stat().st_size == before.st_size
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGHUP)
    until(lambda: reloads(gw, "applied"), "SIGHUP did not apply the key file", timeout=5)
    [hangup] = logs(gw, "signal.hangup")
    assert hangup["api_keys_file"] == "reading the API key file now"
    # Carol now holds alice's entry (same id): the old key is refused, the new one is alice.
    assert modern_call(gw.url, ALICE, "basic__echo").status_code == 401
    assert modern_call(gw.url, CAROL, "basic__echo").status_code == 200
    [applied] = reloads(gw, "applied")
    assert (applied["added"], applied["removed"], applied["changed"]) == (0, 0, 1)
