"""Every request bastion forwards to an upstream for a caller passes the limiter, not only ``tools/call``.

A caller held to N requests an hour must not make an upstream do unbounded work through ``resources/read``,
``prompts/get``, ``completion/complete`` or ``resources/subscribe``: a flood of those is refused at the limit with
the same ``-31001`` as a tool call, in both eras, audited (``request`` records) and counted in the same metric; a
concurrency cap bounds them too, across methods. Real gateway, real fixture upstream (stdio), both limiter
backends (in memory, and a real Redis). Each test has a principal of its own, so budgets never cross tests.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion.auth.apikeys import hash_key
from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.e2e.test_disconnect import V, modern
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import ACCEPT, RpcClient, parse_body

PRINCIPALS = ("reader", "prompter", "mixer", "subscriber", "modern", "listener", "waiter", "templated")
BUDGET = 3


def key(principal: str) -> str:
    return f"key-{principal}-0123456789abcdef"


def _config(workdir: Path, backend: str, redis_server: RedisServer, limits: dict[str, Any]) -> dict[str, Any]:
    (workdir / "basic.jsonl").touch()
    config: dict[str, Any] = {
        "auth": {"api_keys": [{"id": p, "hash": hash_key(key(p))} for p in PRINCIPALS]},
        "upstreams": {"basic": stdio_upstream("tests.fixtures.basic_server", "--record",
                                              str(workdir / "basic.jsonl"))},
        "rate_limits": {"key_prefix": f"fwd-{uuid.uuid4().hex[:8]}", "timeout": "3s", **limits},
    }
    if backend == "redis":
        config["redis"] = {"url": redis_server.url}
    return config


@pytest.fixture(scope="module", params=["memory", "redis"])
def limited(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            redis_server: RedisServer) -> Iterator[GatewayProcess]:
    """A rate limit written as before this change (no ``methods``): it now holds every forwarded request."""
    workdir = tmp_path_factory.mktemp(f"fwd-rate-{request.param}")
    gw = GatewayProcess(_config(workdir, request.param, redis_server, {
        "defaults": [{"name": "per-caller", "rate": f"{BUDGET}/hour", "burst": BUDGET, "per": "principal"}]}),
        workdir).start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module", params=["memory", "redis"])
def capped(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[GatewayProcess]:
    """A concurrency cap of one per principal, and no rate limit."""
    workdir = tmp_path_factory.mktemp(f"fwd-cap-{request.param}")
    gw = GatewayProcess(_config(workdir, request.param, redis_server, {
        "concurrency": [{"name": "inflight", "max": 1, "per": "principal"}]}), workdir).start()
    yield gw
    gw.stop()


def client(gw: GatewayProcess, principal: str) -> RpcClient:
    c = RpcClient(gw.url, {"Authorization": f"Bearer {key(principal)}"})
    c.initialize()
    return c


def read(c: RpcClient, uri: str) -> dict[str, Any]:
    return c.request("resources/read", {"uri": uri})


def greet(c: RpcClient, **arguments: str) -> dict[str, Any]:
    return c.request("prompts/get", {"name": "basic__greet", "arguments": {"language": "english", **arguments}})


def assert_rate_limited(answer: dict[str, Any], limit: str = "per-caller") -> None:
    assert "error" in answer, answer
    error = answer["error"]
    assert error["code"] == -31001, error
    assert error["data"]["limit"] == limit
    assert error["data"]["retryAfter"] > 0


def refusals(gw: GatewayProcess, principal: str) -> list[dict[str, Any]]:
    return [r for r in gw.records("request") if r["principal"]["id"] == principal and r["stage"] == "ratelimit"]


def rejections(gw: GatewayProcess, limit: str) -> float:
    text = httpx.get(gw.base + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'bastion_ratelimit_rejections_total{{limit="{limit}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_resources_read_flood_is_refused_at_the_limit_whatever_the_uri(limited: GatewayProcess) -> None:
    c = client(limited, "reader")
    before = rejections(limited, "per-caller")
    # Each read names another resource of the template: varying the URI buys no fresh budget.
    answers = [read(c, f"basic+memo://notes/{i}") for i in range(BUDGET + 4)]
    assert all("result" in a for a in answers[:BUDGET]), answers[:BUDGET]
    for answer in answers[BUDGET:]:
        assert_rate_limited(answer)
    mine = refusals(limited, "reader")
    assert len(mine) == 4
    assert {(r["method"], r["outcome"], r["decision"], r["stage"], r["limit"]) for r in mine} == \
        {("resources/read", "rate_limited", "deny", "ratelimit", "per-caller")}
    assert mine[0]["target"] == {"name": None, "uri": f"basic+memo://notes/{BUDGET}", "upstream": "basic",
                                 "original": f"memo://notes/{BUDGET}"}
    assert mine[0]["error"]["code"] == -31001
    assert rejections(limited, "per-caller") - before == 4


def test_a_prompts_get_flood_is_refused_and_completion_draws_on_the_same_budget(limited: GatewayProcess) -> None:
    c = client(limited, "prompter")
    answers = [greet(c) for _ in range(BUDGET)]
    assert all("result" in a for a in answers), answers
    assert_rate_limited(greet(c))
    assert_rate_limited(c.request("completion/complete", {
        "ref": {"type": "ref/prompt", "name": "basic__greet"}, "argument": {"name": "language", "value": "e"}}))
    deadline = time.monotonic() + 10
    while len(refusals(limited, "prompter")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(r["method"], r["target"]["name"]) for r in refusals(limited, "prompter")] == \
        [("prompts/get", "basic__greet"), ("completion/complete", "basic__greet")]


def test_tool_calls_and_other_requests_share_one_budget(limited: GatewayProcess) -> None:
    c = client(limited, "mixer")
    assert "result" in c.call("basic__echo", {"message": "one"})
    assert "result" in read(c, "basic+memo://readme")
    assert "result" in greet(c)
    assert_rate_limited(c.call("basic__echo", {"message": "four"}))
    assert_rate_limited(read(c, "basic+memo://readme"))


def test_a_subscribe_and_unsubscribe_flood_is_refused(limited: GatewayProcess) -> None:
    c = client(limited, "subscriber")
    answers = [c.request(method, {"uri": "basic+memo://readme"})
               for method in ("resources/subscribe", "resources/unsubscribe") * 3]
    assert all("result" in a for a in answers[:BUDGET]), answers
    for answer in answers[BUDGET:]:
        assert_rate_limited(answer)
    notes = (limited.workdir / "basic.jsonl").read_text().splitlines()
    # What reached the upstream is what the budget allowed, no more.
    assert sum('"memo://readme"' in line for line in notes) == BUDGET


def test_a_modern_resources_read_flood_is_refused_at_the_limit(limited: GatewayProcess) -> None:
    auth = {"Authorization": f"Bearer {key('modern')}"}
    answers = []
    with httpx.Client(timeout=30) as http:
        for i in range(BUDGET + 2):
            body, headers = modern("resources/read", {"uri": f"basic+memo://notes/m{i}"}, ACCEPT, i + 1)
            r = http.post(limited.url, json=body, headers={**headers, **auth})
            answers.append(parse_body(r)[-1])
    assert all("result" in a for a in answers[:BUDGET]), answers
    for answer in answers[BUDGET:]:
        assert_rate_limited(answer)
    deadline = time.monotonic() + 10
    while len(refusals(limited, "modern")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {(r["era"], r["method"]) for r in refusals(limited, "modern")} == {("modern", "resources/read")}


def test_a_listen_request_honours_only_the_subscriptions_its_budget_allows(limited: GatewayProcess) -> None:
    uris = [f"basic+memo://notes/listen-{i}" for i in range(BUDGET + 2)]
    params = {"notifications": {"resourceSubscriptions": uris},
              "_meta": {"io.modelcontextprotocol/protocolVersion": V,
                        "io.modelcontextprotocol/clientCapabilities": {}}}
    body = {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen", "params": params}
    headers = {"Authorization": f"Bearer {key('listener')}", "Accept": ACCEPT, "Content-Type": "application/json",
               **request_headers("subscriptions/listen", params, V)}
    # The acknowledgement comes first; leaving the block closes the stream, as a client that hangs up does.
    with httpx.Client(timeout=30) as http, http.stream("POST", limited.url, json=body, headers=headers) as stream:
        ack = next(json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:"))
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert len(ack["params"]["notifications"]["resourceSubscriptions"]) == BUDGET
    refused = refusals(limited, "listener")
    assert len(refused) == 2
    assert {(r["method"], r["era"], r["request_id"]) for r in refused} == \
        {("resources/subscribe", "modern", "listen-1")}
    # Each subscription is a forwarded request of its own: the honoured ones are recorded too, one each.
    mine = [r for r in limited.records("request") if r["principal"]["id"] == "listener"]
    assert sorted((r["target"]["uri"], r["outcome"]) for r in mine) == \
        sorted((uri, "allowed" if i < BUDGET else "rate_limited") for i, uri in enumerate(uris))
    assert {(r["method"], r["request_id"]) for r in mine} == {("resources/subscribe", "listen-1")}


def while_slow_runs(slow: Any, probe: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``slow()`` in a thread and ``probe()`` meanwhile until a probe is refused: (that refusal, the slow
    answer). With a cap of one, a probe in flight when the slow request arrives refuses it instead; then again,
    a bounded number of times."""
    for _ in range(5):
        answers: list[dict[str, Any]] = []
        runner = threading.Thread(target=lambda out=answers: out.append(slow()))  # type: ignore[misc]
        runner.start()
        refused: dict[str, Any] | None = None
        while refused is None and runner.is_alive():
            time.sleep(0.05)
            answer = probe()
            if "error" in answer:
                refused = answer
        runner.join(timeout=30)
        if refused is not None:
            assert answers and "result" in answers[0], answers
            return refused, answers[0]
    raise AssertionError("no probe was refused while the slow request ran")


def test_a_concurrency_cap_holds_a_prompt_and_a_read_to_one_at_a_time(capped: GatewayProcess) -> None:
    c, other = client(capped, "waiter"), client(capped, "waiter")
    refused, _ = while_slow_runs(lambda: greet(other, sleep="2"), lambda: read(c, "basic+memo://readme"))
    assert refused["error"]["code"] == -31001
    assert refused["error"]["data"] == {"limit": "inflight", "retryAfter": 1000, "kind": "concurrency"}
    # The prompt's slot is given back with its answer.
    assert "result" in read(c, "basic+memo://readme")
    records = refusals(capped, "waiter")
    assert records and records[-1]["limit"] == "inflight" and records[-1]["method"] == "resources/read"


def test_a_concurrency_cap_spans_tool_calls_and_prompts(capped: GatewayProcess) -> None:
    c, other = client(capped, "templated"), client(capped, "templated")
    refused, _ = while_slow_runs(lambda: other.call("basic__slow", {"seconds": 2}), lambda: greet(c))
    assert refused["error"]["data"]["kind"] == "concurrency"
