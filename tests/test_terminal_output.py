"""Nothing bastion did not write reaches an operator's terminal raw (``bastion.terminal``).

Every ``bastion`` subcommand runs as an admin runs it (a subprocess), on names, keys and values a hostile
upstream, caller or file could choose: ESC sequences that conceal or recolour what follows, C1 controls, bidi
overrides, BEL, DEL, zero-width characters, carriage returns and a newline followed by a line of its own. The
output bytes must hold none of them raw, and the forged line must not start a line. ``test_every_command_has_a_case``
walks the parser, so a new subcommand without a case here fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import structlog

from bastion.cli import build_parser
from bastion.logs import escape_for_terminal
from bastion.pinning import FilePinStore, Pinning, PinningConfig
from bastion.pinning.fingerprint import diff
from bastion.terminal import TerminalText, json_text, printable, printable_lines

FORGED = "forged: approve with: bastion pins approve files read_file"
# Concealed black on black, an 8-bit CSI, bidi override and isolate, BEL, DEL, zero-width space, line separator,
# a tag character, a carriage return, then a line of its own.
HOSTILE = f"x\x1b[30;40m\x1b[8m\x9b2J\u202e\u2066\x07\x7f\u200b\u2028\U000e0041\r\n{FORGED}"
# The same text as a YAML double-quoted scalar (YAML files cannot hold most of these characters raw).
HOSTILE_YAML = json.dumps(HOSTILE, ensure_ascii=True)


def raw_characters(text: str) -> set[str]:
    """What a terminal would act on: every character ``str.isprintable`` refuses but the newline."""
    return {c for c in text if not c.isprintable() and c != "\n"}


def assert_terminal_safe(data: bytes) -> str:
    text = data.decode("utf-8")  # strictly: a lone surrogate written raw would not even encode
    assert raw_characters(text) == set(), text
    forged = [line for line in text.split("\n") if line.strip().startswith("forged")]
    assert forged == [], text
    return text


# ---------------------------------------------------------------------------------------------------------------
# The encoder


def test_printable_escapes_what_a_terminal_acts_on_and_keeps_text() -> None:
    assert printable("plain, ünïcödé ✓ 日本語") == "plain, ünïcödé ✓ 日本語"
    assert printable("a\x1b[8mb\nc\td\x9b\u202e\x7f\U000e0041") == \
        "a\\x1b[8mb\\x0ac\\x09d\\x9b\\u202e\\x7f\\U000e0041"
    assert raw_characters(printable(HOSTILE)) == set()
    assert "\n" not in printable(HOSTILE)
    assert printable_lines("one\x1b[8m\ntwo\r") == "one\\x1b[8m\ntwo\\x0d"


@pytest.mark.parametrize("value", [HOSTILE, {HOSTILE: [HOSTILE, 1, None]}, "\ud800 lone", "\U0001f600 emoji"])
def test_json_text_is_the_same_json_value_with_nothing_raw(value: Any) -> None:
    for indent in (None, 2):
        text = json_text(value, indent=indent)
        assert raw_characters(text) == set()
        assert json.loads(text) == value
    assert "\U0001f600" in json_text("\U0001f600")  # printable text stays readable


def test_the_stream_escapes_everything_but_newlines() -> None:
    import io

    sink = io.StringIO()
    out = TerminalText(sink)
    print("row", HOSTILE, file=out)
    assert sink.getvalue() == f"row {printable_lines(HOSTILE)}\n"
    assert raw_characters(sink.getvalue()) == set()


def test_diff_lines_escape_keys_and_values_and_keep_their_structure() -> None:
    old = {"name": "t", "description": "Transfer.", "annotations": {"readOnlyHint": False}}
    new = {"name": "t", "description": f"Transfer.{HOSTILE}",
           "annotations": {"readOnlyHint": False, "x\x1b[30;40m\x1b[8m": True, "a.b": 1, 'q": 1 -> "': 2}}
    lines = diff(old, new)
    assert lines == [
        'annotations["a.b"]: (absent) -> 1',
        'annotations["q\\": 1 -> \\""]: (absent) -> 2',
        'annotations["x\\u001b[30;40m\\u001b[8m"]: (absent) -> true',
        'description: "Transfer." -> "Transfer.' + json_text(HOSTILE)[1:-1] + '"',
    ]
    assert all(raw_characters(line) == set() and "\n" not in line for line in lines)
    # The value is a JSON string: it reads back as exactly what the upstream sent.
    assert json.loads(lines[-1].split(" -> ", 1)[1]) == f"Transfer.{HOSTILE}"


# ---------------------------------------------------------------------------------------------------------------
# Every subcommand


@dataclass
class World:
    """What the hostile cases run against: a pin store an upstream poisoned, policies, a gateway's approvals API."""

    root: Path
    approvals_url: str = ""
    made: set[str] = field(default_factory=set)

    @property
    def pins(self) -> Path:
        return self.root / "pins.json"


def _seed_pins(path: Path) -> None:
    async def seed() -> None:
        pinning = Pinning(FilePinStore(str(path)), PinningConfig())
        tool = {"name": "transfer", "description": "Transfer an amount.", "annotations": {"readOnlyHint": False}}
        await pinning.reconcile("files", [tool, {"name": f"calc{HOSTILE}", "description": "x"}])
        await pinning.reconcile("files", [
            {**tool, "description": f"Transfer an amount.{HOSTILE}",
             "annotations": {"readOnlyHint": False, f"x\x1b[30;40m\x1b[8m{HOSTILE}": True}},
            {"name": f"calc{HOSTILE}", "description": "y"}])
        await pinning.reject("files", f"calc{HOSTILE}", HOSTILE)

    asyncio.run(seed())


def _approval() -> dict[str, Any]:
    return {"id": HOSTILE, "principal": HOSTILE, "tool": HOSTILE, "upstream": HOSTILE, "rule_id": HOSTILE,
            "message": HOSTILE, "session": HOSTILE, "replica": HOSTILE, "via": [HOSTILE, "cli"],
            "expires_at": time.time() + 60, "arguments": {HOSTILE: HOSTILE, "n": 1}}


class _Approvals(BaseHTTPRequestHandler):
    """The gateway's approvals API answering with what its callers chose (the CLI is an HTTP client of it)."""

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/approvals"):
            self._send(200, {"approvals": [_approval()]})
        else:
            self._send(200, _approval())

    def do_POST(self) -> None:
        if self.path.endswith("/approve"):
            self._send(200, {"id": HOSTILE, "outcome": HOSTILE, "by": HOSTILE})
        elif "missing" in self.path:
            self._send(409, {"error": HOSTILE})
        else:
            self._send(403, {"error": HOSTILE})

    def log_message(self, *_: Any) -> None:
        pass


def _listen_in_range() -> ThreadingHTTPServer:
    for port in range(27400, 27500):
        try:
            return ThreadingHTTPServer(("127.0.0.1", port), _Approvals)
        except OSError:
            continue
    raise RuntimeError("no free port in 27400-27499")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("hostile")
    _seed_pins(root / "pins.json")
    (root / "policies").mkdir()
    (root / "policies" / "deny.yaml").write_text(
        "version: 1\nrules:\n"
        f"  - id: hold\n    effect: approve\n    approval: {{message: {HOSTILE_YAML}}}\n    tools: [files__held]\n"
        f"  - id: deny-all\n    effect: deny\n    description: {HOSTILE_YAML}\n    tools: [files__denied]\n")
    (root / "broken").mkdir()
    (root / "broken" / "bad.yaml").write_text(
        f"version: 1\nrules:\n  - id: {HOSTILE_YAML}\n    effect: {HOSTILE_YAML}\n    {HOSTILE_YAML}: 1\n")
    (root / "cases.yaml").write_text(
        f"policies: policies\ncases:\n  - name: {HOSTILE_YAML}\n    principal: {{id: {HOSTILE_YAML}}}\n"
        f"    tool: files__denied\n    expect: allow\n    rule: {HOSTILE_YAML}\n")
    (root / "bastion.yaml").write_text(
        "auth: none\nupstreams:\n  files:\n    command: [echo]\npolicies: broken\n")
    server = _listen_in_range()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield World(root, approvals_url=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


Case = Callable[[World], list[str]]
PINS = ["--pins-file"]

# (command, variant) -> the arguments after ``bastion`` (as a function of the world they run in).
CASES: dict[tuple[tuple[str, ...], str], Case] = {
    (("check",), "policy problems"): lambda w: ["check", "-c", str(w.root / "bastion.yaml")],
    (("policy", "check"), "policy problems"): lambda w: ["policy", "check", str(w.root / "broken")],
    (("policy", "explain"), "denied"): lambda w: [
        "policy", "explain", "--policies", str(w.root / "policies"), "--principal", HOSTILE, "--group", HOSTILE,
        "--tool", "files__denied", "--args", json.dumps({HOSTILE: HOSTILE})],
    (("policy", "explain"), "held"): lambda w: [
        "policy", "explain", "--policies", str(w.root / "policies"), "--principal", "p", "--tool", "files__held"],
    (("policy", "explain"), "json"): lambda w: [
        "policy", "explain", "--policies", str(w.root / "policies"), "--principal", "p", "--tool", "files__denied",
        "--json"],
    (("policy", "explain"), "bad tool name"): lambda w: [
        "policy", "explain", "--policies", str(w.root / "policies"), "--principal", "p", "--tool", HOSTILE],
    (("policy", "test"), "failing case"): lambda w: ["policy", "test", str(w.root / "cases.yaml")],
    (("keys", "generate"), "hostile group"): lambda w: ["keys", "generate", "--id", "k", "--group", HOSTILE],
    (("keys", "generate"), "hostile id"): lambda w: ["keys", "generate", "--id", HOSTILE],
    (("keys", "hash"), "hostile key"): lambda w: ["keys", "hash"],
    (("approvals", "list"), "table"): lambda w: ["approvals", "list", "--url", w.approvals_url],
    (("approvals", "list"), "json"): lambda w: ["approvals", "list", "--url", w.approvals_url, "--json"],
    (("approvals", "show"), "one"): lambda w: ["approvals", "show", HOSTILE, "--url", w.approvals_url],
    (("approvals", "approve"), "decided"): lambda w: ["approvals", "approve", "a", "--url", w.approvals_url],
    (("approvals", "deny"), "refused"): lambda w: ["approvals", "deny", "a", "--url", w.approvals_url],
    (("approvals", "deny"), "not pending"): lambda w: ["approvals", "deny", "missing", "--url", w.approvals_url],
    (("pins", "list"), "table"): lambda w: ["pins", "list", *PINS, str(w.pins)],
    (("pins", "list"), "json"): lambda w: ["pins", "list", "--json", *PINS, str(w.pins)],
    (("pins", "diff"), "rug pull"): lambda w: ["pins", "diff", "files", "transfer", *PINS, str(w.pins)],
    (("pins", "diff"), "rejected"): lambda w: ["pins", "diff", "files", f"calc{HOSTILE}", *PINS, str(w.pins)],
    (("pins", "diff"), "no such pin"): lambda w: ["pins", "diff", HOSTILE, HOSTILE, *PINS, str(w.pins)],
    (("pins", "reject"), "rug pull"): lambda w: [
        "pins", "reject", "files", "transfer", "--by", HOSTILE, *PINS, str(w.pins)],
    # Last: it approves the rug pull the cases above look at (the module's world is shared, in this order).
    (("pins", "approve"), "rug pull"): lambda w: [
        "pins", "approve", "files", "transfer", "--by", HOSTILE, *PINS, str(w.pins)],
}
# Cases whose output does not quote the hostile text (so the sweep cannot check that it was escaped, not dropped).
QUOTE_NOTHING = {(("keys", "hash"), "hostile key"), (("keys", "generate"), "hostile id")}
# Commands whose output is not for a terminal, and where else that is tested.
EXEMPT = {
    ("serve",): "log lines, escaped by the console renderer (test_console_log_escapes_what_upstreams_chose); "
                "audit records are JSON",
}


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, (*prefix, name))
            return
    yield prefix


def test_every_command_has_a_case() -> None:
    commands = set(_leaves(build_parser()))
    assert commands == {command for command, _ in CASES} | set(EXEMPT)


def bastion(argv: list[str], cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASTION_")}
    return subprocess.run([sys.executable, "-m", "bastion", *argv], cwd=cwd, input=stdin.encode(),
                          capture_output=True, timeout=120, check=False, env=env)


@pytest.mark.parametrize(("command", "variant"), list(CASES), ids=[" ".join((*c, v)) for c, v in CASES])
def test_no_command_prints_what_it_did_not_write_raw(world: World, command: tuple[str, ...], variant: str) -> None:
    done = bastion(CASES[command, variant](world), world.root, stdin=HOSTILE + "\n")
    assert done.returncode in (0, 1, 2), done.stderr
    out = assert_terminal_safe(done.stdout)
    err = assert_terminal_safe(done.stderr)
    if (command, variant) not in QUOTE_NOTHING:  # the case reached the hostile text, and it was shown escaped
        assert "forged: approve" in out + err
    if "json" in variant:  # still JSON, and the same values
        values = [json.loads(line) for line in out.splitlines()] if command == ("pins", "list") else [json.loads(out)]
        assert any(HOSTILE in text for text in _strings(values))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_the_rug_pull_diff_reads_on_a_terminal(tmp_path: Path) -> None:
    """The review's case: the hidden annotation key no longer conceals the changed description or the approve
    line, and the description's payload is on the description's line."""
    _seed_pins(tmp_path / "pins.json")
    done = bastion(["pins", "diff", "files", "transfer", "--pins-file", str(tmp_path / "pins.json")], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = assert_terminal_safe(done.stdout).splitlines()
    (key,) = [line for line in lines if line.startswith("  annotations[")]
    assert key.endswith("]: (absent) -> true")
    (description,) = [line for line in lines if line.startswith("  description: ")]
    assert FORGED in description
    assert lines[-1].startswith("approve with: bastion pins approve files transfer --fingerprint sha256:")


# ---------------------------------------------------------------------------------------------------------------
# The console log


def _render(event_dict: dict[str, Any]) -> str:
    renderer = structlog.dev.ConsoleRenderer(colors=False)
    return str(renderer(None, "info", escape_for_terminal(None, "info", dict(event_dict))))


def test_console_log_escapes_what_upstreams_chose() -> None:
    line = _render({"event": "catalogue.tool_dropped", "tool": f"calc{HOSTILE}", "upstream": "files",
                    f"k{HOSTILE}": 1, "names": [HOSTILE], "error": ValueError(HOSTILE)})
    assert raw_characters(line) == set() and "\n" not in line
    assert " tool='calcx\\x1b[30;40m" in line  # quoted: a "key=value" inside the value is not a field
    assert f"{FORGED}=" not in line


def test_console_log_leaves_escaped_and_plain_lines_as_they_are() -> None:
    plain = {"event": "upstream.stderr", "upstream": "files", "line": printable(HOSTILE), "n": 3}
    assert escape_for_terminal(None, "info", dict(plain)) == plain  # no second escaping of stderr's lines
    assert _render(plain) == str(structlog.dev.ConsoleRenderer(colors=False)(None, "info", dict(plain)))


def test_console_and_json_logs_of_a_gateway_process() -> None:
    script = (
        "import logging, sys, structlog\n"
        "from bastion.logs import configure_logging\n"
        "configure_logging(sys.argv[1], 'info')\n"
        f"h = {HOSTILE!r}\n"
        "structlog.get_logger('bastion.t').warning('catalogue.tool_dropped', tool='calc\\x1b[31mRED\\x1b[0m')\n"
        "structlog.get_logger('bastion.t').warning('catalogue.tool_dropped', tool='calc' + h)\n"
        "logging.getLogger('httpx').warning('from %s', h)\n"
        "try:\n    raise ValueError(h)\nexcept ValueError:\n    structlog.get_logger('bastion.t').exception('boom')\n")
    for fmt in ("console", "json"):
        done = subprocess.run([sys.executable, "-c", script, fmt], capture_output=True, timeout=60, check=True)
        text = assert_terminal_safe(done.stderr)
        if fmt == "json":
            records = [json.loads(line) for line in text.splitlines()]
            assert records[1]["tool"] == f"calc{HOSTILE}"  # escaped once, by JSON: the value itself
            assert HOSTILE in records[3]["exception"]
        else:
            assert "tool='calc\\x1b[31mRED\\x1b[0m'" in text  # the review's case: printed raw, it was red
            assert "Traceback (most recent call last)" in text  # the traceback keeps its lines
