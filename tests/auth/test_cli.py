"""``bastion keys`` as a real subprocess."""

from __future__ import annotations

import subprocess
import sys

import yaml

from bastion.auth import AuthConfig
from bastion.auth.apikeys import ApiKeyTable


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bastion.auth.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=60, check=False)


def test_generate_prints_key_once_and_a_loadable_entry() -> None:
    out = run("keys", "generate", "--id", "alice", "--group", "eng", "--group", "ops")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("#")
    key = lines[1]
    assert key.startswith("bst_")
    assert out.stdout.count(key) == 1
    entries = yaml.safe_load("\n".join(lines[2:]))
    assert entries == [{"id": "alice", "hash": entries[0]["hash"], "groups": ["eng", "ops"]}]
    cfg = AuthConfig.from_mapping({"api_keys": entries}, listen_host="0.0.0.0")
    found = ApiKeyTable(cfg.api_keys).lookup(key)
    assert found is not None
    assert found.id == "alice"
    # The hash subcommand agrees with the generator.
    hashed = run("keys", "hash", stdin=key + "\n")
    assert hashed.returncode == 0
    assert hashed.stdout.strip() == entries[0]["hash"]


def test_generate_rejects_bad_id() -> None:
    out = run("keys", "generate", "--id", "has space")
    assert out.returncode == 2
    assert "whitespace" in out.stderr
    assert out.stdout == ""


def test_hash_known_value_and_empty_input() -> None:
    out = run("keys", "hash", stdin="abc\n")
    assert out.stdout == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"
    empty = run("keys", "hash")
    assert empty.returncode == 2
    assert "no key" in empty.stderr


def test_usage_errors() -> None:
    assert run("keys").returncode == 2
    assert run("keys", "generate").returncode == 2
