"""A concurrency cap bounds the upstream's work, not bastion's wait: cancelling a call, hanging up on it, or bastion's
own timeout ends the call at once (and its audit record is written at once), but its slot stays taken until the
upstream is done with it (docs/rate-limits.md, "Abandoned calls keep their slot").

The upstream (``tests.fixtures.stubborn_server``) ignores cancellation, as MCP allows, and records when each call
starts and ends: a cap of one must never see two of its calls running there at once. Both limiter backends.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import stdio_upstream
from tests.e2e.test_disconnect import hang_up, modern
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import ACCEPT, RpcClient, parse_body

CAP = "one-at-a-time"


@pytest.fixture(scope="module", params=["memory", "redis"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
       redis_server: RedisServer) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp(f"holdover-{request.param}")
    for name in ("stub", "tight"):
        (workdir / f"{name}.jsonl").touch()
    config: dict[str, Any] = {
        "auth": "none",
        "upstreams": {
            "stub": stdio_upstream("tests.fixtures.stubborn_server", "--record", str(workdir / "stub.jsonl"),
                                   timeout="30s"),
            "tight": stdio_upstream("tests.fixtures.stubborn_server", "--record", str(workdir / "tight.jsonl"),
                                    timeout="1s"),
        },
        # A short lease TTL: a held-over slot outlives it many times over, on its heartbeat alone.
        "rate_limits": {"concurrency": [{"name": CAP, "max": 1, "per": "principal"}], "lease_ttl": "1s",
                        "key_prefix": f"holdover-{uuid.uuid4().hex[:8]}"},
    }
    if request.param == "redis":
        config["redis"] = {"url": redis_server.url}
    g = GatewayProcess(config, workdir).start()
    yield g
    g.stop()


def notes(gw: GatewayProcess, upstream: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (gw.workdir / f"{upstream}.jsonl").read_text().splitlines()]


def wait_for(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def never_two_at_once(gw: GatewayProcess) -> None:
    """The upstreams' own record: at no moment did two calls of this principal run there together."""
    spans: dict[str, list[float]] = {}
    for upstream in ("stub", "tight"):
        for note in notes(gw, upstream):
            if "start" in note:
                spans.setdefault(note["start"], [note["t"], float("inf")])
            elif "end" in note:
                spans[note["end"]][1] = note["t"]
    ordered = sorted(spans.values())
    for before, after in itertools.pairwise(ordered):
        assert before[1] <= after[0] + 0.05, ordered


def legacy_call(client: RpcClient, rid: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    response = client.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                            "params": {"name": name, "arguments": arguments}})
    messages = [m for m in parse_body(response) if m.get("id") == rid]
    return messages[-1] if messages else {}


def echo_until_admitted(client: RpcClient, timeout: float = 15.0) -> float:
    """Call the quick tool until the cap admits it; returns when (monotonic)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = client.call("stub__echo", {"message": "hi"})
        if "result" in answer:
            return time.monotonic()
        assert answer["error"]["code"] == -31001, answer
        assert time.monotonic() < deadline, "the slot was never freed"
        time.sleep(0.1)


def test_cancelling_each_call_does_not_run_more_than_the_cap_upstream(gw: GatewayProcess) -> None:
    client = RpcClient(gw.url)
    try:
        client.initialize()
        before = len(gw.records("tool.call"))
        first = threading.Thread(target=legacy_call, args=(client, 101, "stub__stubborn",
                                                           {"seconds": 3, "tag": "cancel-1"}))
        first.start()
        wait_for(lambda: any(n.get("start") == "cancel-1" for n in notes(gw, "stub")))
        client.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 101}})
        # The cancelled call is audited at once, and says its slot is held over.
        records = gw.wait_records("tool.call", before + 1)[before:]
        assert records[0]["outcome"] == "client_disconnected", records[0]
        assert records[0]["stage"] == "forward"
        first.join(10)
        # Call, cancel, call, cancel...: while the upstream still runs the first, each is refused.
        for i in range(2, 6):
            answer = legacy_call(client, 100 + i, "stub__stubborn", {"seconds": 3, "tag": f"cancel-{i}"})
            client.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 100 + i}})
            assert answer.get("error", {}).get("code") == -31001, answer
            assert answer["error"]["data"]["kind"] == "concurrency"
        assert [n["start"] for n in notes(gw, "stub") if "start" in n] == ["cancel-1"]
        # The upstream's late answer frees the slot.
        echo_until_admitted(client)
        # Not before the upstream was done: it notes the end before it answers.
        assert any(n.get("end") == "cancel-1" for n in notes(gw, "stub"))
    finally:
        client.close()
    never_two_at_once(gw)
    assert records[0].get("held_over") == [CAP]
    assert "Traceback" not in gw.stderr()


def test_a_cancelled_prompt_keeps_its_slot_until_the_upstream_is_done(gw: GatewayProcess) -> None:
    """The cap holds every forwarded request, and a prompts/get abandoned by its client like a tool call."""
    client = RpcClient(gw.url)
    try:
        client.initialize()
        first = threading.Thread(target=lambda: client.post({
            "jsonrpc": "2.0", "id": 201, "method": "prompts/get",
            "params": {"name": "stub__stubborn", "arguments": {"seconds": "3", "tag": "prompt-1"}}}))
        first.start()
        wait_for(lambda: any(n.get("start") == "prompt-1" for n in notes(gw, "stub")))
        client.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 201}})
        first.join(10)
        # Cancelled, and still running upstream: a tool call of the same principal is refused meanwhile.
        answer = client.call("stub__echo", {"message": "hi"})
        assert answer.get("error", {}).get("code") == -31001, answer
        assert answer["error"]["data"]["kind"] == "concurrency"
        echo_until_admitted(client)
        assert any(n.get("end") == "prompt-1" for n in notes(gw, "stub"))
    finally:
        client.close()
    never_two_at_once(gw)
    assert "Traceback" not in gw.stderr()


def test_bastions_own_timeout_keeps_the_slot_for_the_grace_period(gw: GatewayProcess) -> None:
    client = RpcClient(gw.url)
    try:
        client.initialize()
        answer = client.call("tight__stubborn", {"seconds": 4, "tag": "timeout-1"})
        timed_out = time.monotonic()
        assert answer.get("error", {}).get("code") == -31003, answer
        record = gw.wait_records("tool.call", 1)[-1]
        assert record["outcome"] == "timeout", record
        # The upstream still runs it: the slot stays taken for the upstream's timeout (1 s) after bastion gave up.
        early = client.call("stub__echo", {"message": "hi"})
        assert early.get("error", {}).get("code") == -31001, early
        admitted = echo_until_admitted(client)
        assert 0.8 <= admitted - timed_out <= 5.0
        wait_for(lambda: any(n.get("end") == "timeout-1" for n in notes(gw, "tight")))
    finally:
        client.close()
    assert record.get("held_over") == [CAP]


def test_a_modern_client_hanging_up_does_not_free_the_slot_early(gw: GatewayProcess) -> None:
    before = len(gw.records("tool.call"))
    body, headers = modern("tools/call", {"name": "stub__stubborn", "arguments": {"seconds": 2.5, "tag": "hangup-1"}},
                           ACCEPT, 7)
    hang_up(gw, body, headers)
    records = gw.wait_records("tool.call", before + 1)[before:]
    assert records[0]["outcome"] == "client_disconnected", records[0]
    body, headers = modern("tools/call", {"name": "stub__stubborn", "arguments": {"seconds": 2.5, "tag": "hangup-2"}},
                           "application/json", 8)
    refused = httpx.post(gw.url, json=body, headers=headers, timeout=30).json()
    assert refused.get("error", {}).get("code") == -31001, refused
    wait_for(lambda: any(n.get("end") == "hangup-1" for n in notes(gw, "stub")))
    client = RpcClient(gw.url)
    try:
        client.initialize()
        echo_until_admitted(client)
    finally:
        client.close()
    assert [n["start"] for n in notes(gw, "stub") if str(n.get("start", "")).startswith("hangup")] == ["hangup-1"]
    never_two_at_once(gw)
    assert records[0].get("held_over") == [CAP]
