"""The API key file re-read while the gateway runs (``auth.keyfile``): what a reload swaps into the authenticator's
key ring, what it refuses, and what its log line says. In process, on real files; the running gateway is
tests/e2e/test_api_key_reload.py."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from structlog.testing import capture_logs

from bastion.auth import AuthConfig, Authenticator, build_authenticator, hash_key, key_ring
from bastion.auth.apikeys import ApiKeyTable, KeyRing
from bastion.auth.keyfile import KeyFile, KeyWatcher
from bastion.errors import AuthenticationError, ConfigError
from tests.auth.test_jwt import ISSUER, RESOURCE, sign
from tests.support.jwks import JwksServer, KeyPair

ALICE = "bst_alice_" + "a" * 40
BOB = "bst_bob___" + "b" * 40
CAROL = "bst_carol_" + "c" * 40


def entry(key_id: str, key: str, groups: list[str] | None = None, **attributes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": key_id, "hash": hash_key(key)}
    if groups:
        out["groups"] = groups
    if attributes:
        out["attributes"] = attributes
    return out


def write(file: Path, *entries: dict[str, Any]) -> None:
    file.write_text(yaml.safe_dump({"api_keys": list(entries)}))


class Gateway:
    """What the assembly wires: the config's ring, the authenticator over it, the watcher swapping into it."""

    def __init__(self, cfg: AuthConfig, http: httpx.AsyncClient) -> None:
        ring = key_ring(cfg)
        assert ring is not None and cfg.api_keys_file is not None
        self.ring: KeyRing = ring
        self.auth: Authenticator = build_authenticator(cfg, http, ring)
        self.events: list[tuple[str, object]] = []
        self.watcher = KeyWatcher(cfg.api_keys_file, self._reloaded, inline=ring.inline, initial=ring.table,
                                  on_failure=lambda e: self.events.append(("failure", e)),
                                  on_recovered=lambda t: self.events.append(("recovered", len(t))))

    def _reloaded(self, table: ApiKeyTable) -> None:
        self.ring.swap(table)
        self.events.append(("reload", len(table)))

    def polls(self, count: int) -> None:
        for _ in range(count):
            self.watcher.report(self.watcher.poll())

    async def who(self, key: str) -> str | None:
        try:
            return (await self.auth.authenticate({"Authorization": f"Bearer {key}"})).id
        except AuthenticationError:
            return None


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def config(tmp_path: Path, inline: list[dict[str, Any]] | None = None, **extra: Any) -> AuthConfig:
    mapping: dict[str, Any] = {"api_keys_file": "keys.yaml", **extra}
    if inline:
        mapping["api_keys"] = inline
    return AuthConfig.from_mapping(mapping, listen_host="0.0.0.0", base_dir=tmp_path)


async def test_a_removed_key_is_refused_and_a_changed_one_is_the_new_principal(tmp_path: Path,
                                                                             http: httpx.AsyncClient) -> None:
    write(tmp_path / "keys.yaml", entry("alice", ALICE, ["eng"]), entry("bob", BOB, ["eng"]))
    gw = Gateway(config(tmp_path), http)
    assert await gw.who(ALICE) == "alice"
    write(tmp_path / "keys.yaml", entry("bob", BOB, ["ops"], team="search"))
    gw.polls(1)
    assert await gw.who(ALICE) == "alice", "applied on one look: the file may be half-written"
    with capture_logs() as logs:
        gw.polls(1)
    assert gw.events == [("reload", 1)]
    assert await gw.who(ALICE) is None
    bob = await gw.auth.authenticate({"X-API-Key": BOB})
    assert (bob.groups, dict(bob.attributes)) == ({"ops"}, {"team": "search"})
    # One line per reload, with its counts and never a hash.
    assert logs == [{"event": "api_keys.reload", "outcome": "applied", "file": str(tmp_path / "keys.yaml"),
                     "keys": 1, "inline": 0, "from_file": 1, "added": 0, "removed": 1, "changed": 1,
                     "log_level": "info"}]


async def test_a_broken_file_keeps_the_table_in_force_and_its_end_is_reported(tmp_path: Path,
                                                                            http: httpx.AsyncClient) -> None:
    write(tmp_path / "keys.yaml", entry("alice", ALICE), entry("bob", BOB))
    gw = Gateway(config(tmp_path), http)
    good = (tmp_path / "keys.yaml").read_text()
    (tmp_path / "keys.yaml").write_text("api_keys:\n  - id: bob\n    hash: " + hash_key(BOB) + "\n  - {id: [\n")
    with capture_logs() as logs:
        gw.polls(3)
    broken = f"{tmp_path / 'keys.yaml'}:5: invalid YAML: expected the node content, but found '<stream end>'"
    assert gw.events == [("failure", broken)]
    assert [(e["outcome"], e["keeping_keys"], e["log_level"]) for e in logs] == [("rejected", 2, "error")]
    assert gw.watcher.status == {"ok": False, "loaded_at": gw.watcher.loaded_at, "keys": 2,
                                 "error": broken}
    assert await gw.who(ALICE) == "alice"
    # The very file in force again: nothing to swap, and the error is over.
    (tmp_path / "keys.yaml").write_text(good)
    with capture_logs() as logs:
        gw.polls(2)
    assert gw.events[1:] == [("recovered", 2)]
    assert [(e["event"], e["outcome"], e["keys"]) for e in logs] == [("api_keys.reload", "unchanged", 2)]
    assert gw.watcher.status["ok"] is True


@pytest.mark.parametrize("kind", ["a FIFO", "a directory"])
async def test_a_key_file_that_is_not_a_regular_file_is_rejected_without_blocking(
        tmp_path: Path, http: httpx.AsyncClient, kind: str) -> None:
    # Reading a FIFO blocks until a writer comes: the watcher's read never returned, so no later change of the
    # file was ever applied while its status said ok (and the stuck thread held up the process's exit).
    write(tmp_path / "keys.yaml", entry("alice", ALICE), entry("bob", BOB))
    gw = Gateway(config(tmp_path), http)
    (tmp_path / "keys.yaml").unlink()
    if kind == "a FIFO":
        os.mkfifo(tmp_path / "keys.yaml")
    else:
        (tmp_path / "keys.yaml").mkdir()
    # In a daemon thread: a read that blocks (the old code's) fails the test instead of hanging it.
    polling = threading.Thread(target=gw.polls, args=(2,), daemon=True)
    polling.start()
    polling.join(timeout=20)
    assert not polling.is_alive(), "the read of the key file blocked"
    assert gw.events == [("failure", f"{tmp_path / 'keys.yaml'} [auth.api_keys_file]: cannot read keys file: "
                                     f"not a regular file but {kind}")]
    if kind == "a FIFO":
        (tmp_path / "keys.yaml").unlink()
    else:
        (tmp_path / "keys.yaml").rmdir()
    write(tmp_path / "keys.yaml", entry("bob", BOB))
    gw.polls(2)
    assert gw.events[-1] == ("reload", 1) and await gw.who(ALICE) is None


def test_bytes_already_parsed_are_not_parsed_again(tmp_path: Path) -> None:
    # The watcher reads the file every tenth poll although nothing changed, and after every poll that found it
    # broken; parsing ten thousand keys each time took seconds of CPU under the interpreter lock.
    write(tmp_path / "keys.yaml", entry("alice", ALICE), entry("bob", BOB))
    source = KeyFile(tmp_path / "keys.yaml")
    version, table = source.read()
    assert source.read()[1] is table
    (tmp_path / "keys.yaml").write_text((tmp_path / "keys.yaml").read_text() + "# a comment\n")
    again, other = source.read()
    assert other is not table and again == version  # parsed again: other bytes, the same entries
    (tmp_path / "keys.yaml").write_text("api_keys: [{id: carol, key: " + CAROL + "}]\n")
    with pytest.raises(ConfigError) as first:
        source.read()
    with pytest.raises(ConfigError) as second:
        source.read()
    assert second.value is first.value and "plaintext key" in str(second.value)


@pytest.mark.parametrize(("written", "error"), [
    (b"api_keys: []\n# caf\xc3", "keys file is not valid UTF-8"),  # cut inside a character, or not text at all
    (b"api_keys: " + b"[" * 20000 + b"]" * 20000, "invalid YAML: nested too deeply"),
])
async def test_a_file_no_loader_foresaw_is_rejected_and_the_next_good_one_applied(
        tmp_path: Path, http: httpx.AsyncClient, written: bytes, error: str) -> None:
    # Both used to escape the loader as ValueError / RecursionError and end the watcher's task: the file was never
    # read again, so no later revocation took effect, and the status still said ok.
    write(tmp_path / "keys.yaml", entry("alice", ALICE), entry("bob", BOB))
    gw = Gateway(config(tmp_path), http)
    (tmp_path / "keys.yaml").write_bytes(written)
    gw.polls(2)
    assert gw.events == [("failure", f"{tmp_path / 'keys.yaml'}: {error}")]
    assert gw.watcher.status["ok"] is False
    write(tmp_path / "keys.yaml", entry("bob", BOB))
    gw.polls(2)
    assert gw.events[-1] == ("reload", 1)
    assert await gw.who(ALICE) is None


@pytest.mark.parametrize(("written", "error"), [
    ([entry("alice", CAROL)], "API key id 'alice' is also in auth.api_keys of the config file"),
    ([entry("carol", ALICE)], "API key 'carol' has the same hash as an entry in auth.api_keys of the config file"),
    ([entry("bob", BOB), entry("bob", CAROL)], "duplicate API key id 'bob'"),
    ([{"id": "carol", "secret": CAROL}], "'secret' looks like a plaintext key"),
])
async def test_the_rules_of_the_config_load_hold_for_every_reload(tmp_path: Path, http: httpx.AsyncClient,
                                                                  written: list[dict[str, Any]], error: str) -> None:
    write(tmp_path / "keys.yaml", entry("bob", BOB))
    gw = Gateway(config(tmp_path, inline=[entry("alice", ALICE)]), http)
    write(tmp_path / "keys.yaml", *written)
    with capture_logs() as logs:
        assert gw.watcher.reload_now() is False
    [(kind, message)] = gw.events
    assert kind == "failure" and str(message).startswith(str(tmp_path / "keys.yaml")) and error in str(message)
    assert CAROL not in repr(logs) and hash_key(CAROL) not in repr(logs)
    assert (await gw.who(ALICE), await gw.who(BOB), await gw.who(CAROL)) == ("alice", "bob", None)


async def test_inline_keys_stay_and_an_empty_file_revokes_every_key_it_held(tmp_path: Path,
                                                                           http: httpx.AsyncClient) -> None:
    """``auth.api_keys`` is read with the config file, at start only: every reloaded table holds it. A file
    emptied (every key in it revoked) is a valid table, not an error."""
    write(tmp_path / "keys.yaml", entry("bob", BOB))
    gw = Gateway(config(tmp_path, inline=[entry("alice", ALICE)]), http)
    (tmp_path / "keys.yaml").write_text("")
    with capture_logs() as logs:
        assert gw.watcher.reload_now() is True
    assert (await gw.who(ALICE), await gw.who(BOB)) == ("alice", None)
    assert [(e["keys"], e["inline"], e["from_file"], e["removed"]) for e in logs] == [(1, 1, 0, 1)]
    write(tmp_path / "keys.yaml", entry("carol", CAROL))
    assert gw.watcher.reload_now() is True
    assert (await gw.who(ALICE), await gw.who(CAROL)) == ("alice", "carol")


async def test_a_key_file_empty_at_start_takes_keys_added_later(tmp_path: Path, http: httpx.AsyncClient) -> None:
    (tmp_path / "keys.yaml").write_text("api_keys: []\n")
    cfg = config(tmp_path, jwt={"issuer": ISSUER, "jwks_url": "https://idp.example/jwks"}, resource=RESOURCE)
    gw = Gateway(cfg, http)
    assert await gw.who(ALICE) is None
    write(tmp_path / "keys.yaml", entry("alice", ALICE))
    assert gw.watcher.reload_now() is True
    assert await gw.who(ALICE) == "alice"


async def test_a_token_may_not_take_the_id_of_a_key_a_reload_added(tmp_path: Path, http: httpx.AsyncClient,
                                                                   jwks_server: JwksServer, rsa_key: KeyPair) -> None:
    """One id, one caller, against the table in force: a key added under the id ``carol`` makes a token whose
    subject is ``carol`` a stranger from then on; removing the key frees the id again."""
    write(tmp_path / "keys.yaml", entry("bob", BOB))
    gw = Gateway(config(tmp_path, jwt={"issuer": ISSUER, "jwks_url": jwks_server.url}, resource=RESOURCE), http)
    token = sign(rsa_key, sub="carol")
    assert await gw.who(token) == "carol"
    write(tmp_path / "keys.yaml", entry("bob", BOB), entry("carol", CAROL))
    assert gw.watcher.reload_now() is True
    with capture_logs(), pytest.raises(AuthenticationError) as refused:
        await gw.auth.authenticate({"Authorization": f"Bearer {token}"})
    assert "API key's id" in (refused.value.log_detail or "")
    write(tmp_path / "keys.yaml", entry("bob", BOB))
    assert gw.watcher.reload_now() is True
    assert await gw.who(token) == "carol"


@pytest.mark.parametrize(("written", "error"), [
    # Two ``groups:`` in one entry: safe_load kept the last and dropped the first without a word.
    ("api_keys:\n  - id: alice\n    hash: {h}\n    groups: [admin]\n    groups: [viewer]\n",
     "duplicate key 'groups' (first at line 4)"),
    # An alias bomb: nine lines that name 10^9 strings once the table is read into one.
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "api_keys:\n  - id: alice\n    hash: {h}\n    attributes: {{bomb: [*b, *b]}}\n", "alias"),
])
async def test_a_key_file_is_read_as_strictly_as_a_policy_file(
        tmp_path: Path, http: httpx.AsyncClient, written: str, error: str) -> None:
    write(tmp_path / "keys.yaml", entry("alice", ALICE))
    gw = Gateway(config(tmp_path), http)
    (tmp_path / "keys.yaml").write_text(written.format(h=hash_key(ALICE)))
    gw.polls(2)
    [(kind, message)] = gw.events
    assert kind == "failure" and error in message, message
    assert gw.watcher.status["ok"] is False


async def test_a_key_file_larger_than_the_bound_is_refused_unread(tmp_path: Path, http: httpx.AsyncClient,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import bastion.auth.config as auth_config
    monkeypatch.setattr(auth_config, "MAX_KEYS_FILE_BYTES", 4096)  # the bound, made small enough to cross here
    write(tmp_path / "keys.yaml", entry("alice", ALICE))
    gw = Gateway(config(tmp_path), http)
    (tmp_path / "keys.yaml").write_text("# " + "x" * 5000 + "\n" + (tmp_path / "keys.yaml").read_text())
    gw.polls(2)
    [(kind, message)] = gw.events
    assert kind == "failure" and "keys file is larger than" in message, message
    assert await gw.who(ALICE) == "alice"
