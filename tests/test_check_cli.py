"""``bastion check`` as an admin runs it (real subprocesses, real files, a real Redis for ``--online``): it finds
what ``bastion serve`` would refuse, every problem of every policy file, and exits with the documented codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.redis_server import RedisServer

STDIO = "upstreams:\n  files:\n    command: [echo]\n"


def check(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BASTION_")}
    return subprocess.run([sys.executable, "-m", "bastion", "check", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False, env={**environ, **(env or {})})


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_good_config_passes_with_its_policies(tmp_path: Path) -> None:
    write(tmp_path / "policies" / "a.yaml", "version: 1\nrules:\n  - id: all\n    effect: allow\n")
    write(tmp_path / "bastion.yaml", "auth: none\n" + STDIO + "policies: policies\n")
    done = check("-c", "bastion.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "OK — 1 upstream(s)" in done.stdout
    assert done.stderr == ""


def test_every_problem_of_every_policy_file_is_listed(tmp_path: Path) -> None:
    write(tmp_path / "policies" / "a.yaml",
          "version: 1\nrules:\n  - id: one\n    effect: alow\n  - id: two\n    efect: allow\n")
    write(tmp_path / "policies" / "b.yaml",
          "version: 1\nrules:\n  - id: three\n    effect: allow\n    limits:\n"
          "      - {name: l, rate: fast, per: principal}\n")
    write(tmp_path / "bastion.yaml", "auth: none\n" + STDIO + "policies: policies\n")
    done = check("-c", "bastion.yaml", cwd=tmp_path)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    a, b = tmp_path / "policies" / "a.yaml", tmp_path / "policies" / "b.yaml"
    # Prefixes: the lists of allowed values and keys grow with the policy language.
    expected = [
        f"error: {a}:4 [rules[0].effect]: 'alow' is not one of ",
        f"error: {a}:5 [rules[1]]: missing required key: 'effect'",
        f"error: {a}:6 [rules[1].efect]: unknown key 'efect'; allowed keys here: ",
        f"error: {b}:6 [rules[0].limits[0].rate]: invalid rate 'fast'",
    ]
    assert len(errors) == len(expected), done.stderr
    assert all(line.startswith(prefix) for line, prefix in zip(errors, expected, strict=True)), done.stderr
    assert "4 problem(s)" in done.stderr
    # The same list from the policy subcommand, with the same exit code.
    policy = subprocess.run([sys.executable, "-m", "bastion", "policy", "check", "policies"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=False)
    assert policy.returncode == 1
    assert len([line for line in policy.stderr.splitlines() if line.startswith("error: ")]) == 4


def test_duplicate_rule_ids_across_files_are_found(tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml"):
        write(tmp_path / "policies" / name, "version: 1\nrules:\n  - id: same\n    effect: allow\n")
    write(tmp_path / "bastion.yaml", "auth: none\n" + STDIO + "policies: policies\n")
    done = check("-c", "bastion.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert "duplicate rule id 'same'" in done.stderr


def test_a_missing_or_broken_key_file_is_found(tmp_path: Path) -> None:
    write(tmp_path / "bastion.yaml", "auth:\n  api_keys_file: keys.yaml\n" + STDIO)
    done = check("-c", "bastion.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert "[auth.api_keys_file]: cannot read keys file" in done.stderr
    write(tmp_path / "keys.yaml", "api_keys:\n  - id: a\n    hash: nope\n")
    done = check("-c", "bastion.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert "keys.yaml" in done.stderr and "hash" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_misspelt_upstream_key_is_named(tmp_path: Path) -> None:
    write(tmp_path / "bastion.yaml", "auth: none\nupstreams:\n  files:\n    comand: [echo]\n")
    done = check("-c", "bastion.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert "bastion.yaml:4 [upstreams.files.comand]: unknown key 'comand'; did you mean 'command'?" in done.stderr


def test_a_yaml_boolean_where_a_word_is_expected_gets_a_hint(tmp_path: Path) -> None:
    write(tmp_path / "bastion.yaml", "auth: none\n" + STDIO + "validation:\n  output: off\n")
    done = check("-c", "bastion.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert ("bastion.yaml:6 [validation.output]: must be one of strict, warn, off (YAML 1.1 reads the unquoted "
            'word off as the boolean false: quote it, output: "off")') in done.stderr
    write(tmp_path / "bastion.yaml", "auth: none\n" + STDIO + "validation:\n  output: \"off\"\n")
    assert check("-c", "bastion.yaml", cwd=tmp_path).returncode == 0


def test_anonymous_auth_on_a_public_listener_is_warned_about(tmp_path: Path) -> None:
    write(tmp_path / "public.yaml", "listen: {host: 0.0.0.0}\nauth: none\n" + STDIO)
    done = check("-c", "public.yaml", cwd=tmp_path)
    assert done.returncode == 0  # serve accepts it: a warning, not a problem
    assert "warning: 'auth: none' on a non-loopback listener (0.0.0.0:8080)" in done.stdout
    write(tmp_path / "local.yaml", "auth: none\n" + STDIO)
    assert "auth: none" not in check("-c", "local.yaml", cwd=tmp_path).stdout


def test_no_config_is_a_usage_error(tmp_path: Path) -> None:
    done = check(cwd=tmp_path)
    assert done.returncode == 2
    assert "no config file given" in done.stderr


def test_online_reaches_the_pin_store_or_says_it_cannot(tmp_path: Path, private_redis: RedisServer) -> None:
    redis_url = private_redis.url
    write(tmp_path / "bastion.yaml", "auth: none\n" + STDIO + "pinning: {store: redis}\n")
    up = check("-c", "bastion.yaml", "--online", cwd=tmp_path, env={"BASTION_REDIS_URL": redis_url})
    assert up.returncode == 0, up.stderr
    # Offline, an unreachable Redis is not looked at.
    dead = {"BASTION_REDIS_URL": "redis://127.0.0.1:1/0"}
    assert check("-c", "bastion.yaml", cwd=tmp_path, env=dead).returncode == 0
    down = check("-c", "bastion.yaml", "--online", cwd=tmp_path, env=dead)
    assert down.returncode == 3
    assert "error: pin store unreachable (RedisPinStore)" in down.stderr


def test_bounds_an_operator_tunes_are_validated(tmp_path: Path) -> None:
    """``listen.client_backlog`` and an upstream's ``max_server_requests``: out-of-range values are errors that name
    the key, before anything serves; values in range pass."""
    cases = {
        "listen:\n  client_backlog: 0\n" + STDIO: "[listen.client_backlog]: expected an integer >= 16",
        "listen:\n  client_backlog: 100000\n" + STDIO: "[listen.client_backlog]: at most 65536 messages",
        "listen:\n  client_backlog: lots\n" + STDIO: "[listen.client_backlog]: expected an integer >= 16",
        STDIO + "    max_server_requests: 0\n": "[upstreams.files.max_server_requests]: max_server_requests must be "
                                               "a whole number from 1 to 4096",
        STDIO + "    max_server_requests: true\n": "[upstreams.files.max_server_requests]: max_server_requests must "
                                                  "be a whole number from 1 to 4096",
    }
    for text, error in cases.items():
        write(tmp_path / "bastion.yaml", "auth: none\n" + text)
        done = check("-c", "bastion.yaml", cwd=tmp_path)
        assert done.returncode == 1 and error in done.stderr, (text, done.stderr)
    write(tmp_path / "bastion.yaml", "auth: none\nlisten:\n  client_backlog: 1024\n" + STDIO
          + "    max_server_requests: 128\n")
    done = check("-c", "bastion.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
