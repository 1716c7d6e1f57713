"""Responses belong to the request that asked (issue 12, item 1), through a running gateway, with two principals
and a hostile upstream that answers crosswise, over stdio and Streamable HTTP; and an upstream's log messages
and ``roots/list`` outside any call (issue 14, item 5)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.auth.apikeys import hash_key
from tests.e2e.conftest import LEGACY, stdio_upstream
from tests.support.fixture_server import FixtureServer
from tests.support.gateway import GatewayProcess

ALICE_KEY = "bst_alice_" + "a" * 40
BOB_KEY = "bst_bob_" + "b" * 40
EVE_KEY = "bst_eve_" + "e" * 40  # a guest: may see the HTTP upstream only
POLICY = """\
version: 1
rules:
  - {id: staff, effect: allow, principals: {groups: [eng, ops]}, upstreams: [xs, xh]}
  - {id: guests, effect: allow, principals: {groups: [guests]}, upstreams: [xh]}
"""
# An AWS access key id: the sanitizer redacts it wherever upstream text reaches a client.
LEAKY = "AKIAIOSFODNN7EXAMPLE"


@pytest.fixture(scope="module")
def crosswise_http() -> Iterator[FixtureServer]:
    server = FixtureServer("tests.fixtures.crosswise_server")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, crosswise_http: FixtureServer) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("crosswise")
    policies = workdir / "policies"
    policies.mkdir()
    (policies / "rules.yaml").write_text(POLICY)
    gateway = GatewayProcess({
        "auth": {"api_keys": [{"id": "alice", "hash": hash_key(ALICE_KEY), "groups": ["eng"]},
                              {"id": "bob", "hash": hash_key(BOB_KEY), "groups": ["ops"]},
                              {"id": "eve", "hash": hash_key(EVE_KEY), "groups": ["guests"]}]},
        "policies": str(policies),
        "upstreams": {"xs": stdio_upstream("tests.fixtures.crosswise_server", timeout="10s"),
                      "xh": {"url": crosswise_http.url, "timeout": "10s", **LEGACY}},
    }, workdir).start()
    yield gateway
    gateway.stop()


@asynccontextmanager
async def connect(gw: GatewayProcess, key: str, **kw: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http, \
            Client(streamable_http_client(gw.url, http_client=http), mode="legacy", **kw) as client:
        yield client


def text(result: types.CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def strays(gw: GatewayProcess) -> dict[tuple[str, str], float]:
    body = httpx.get(gw.base + "/metrics", timeout=5).text
    out: dict[tuple[str, str], float] = {}
    for line in body.splitlines():
        m = re.match(r'bastion_upstream_stray_responses_total\{(.*)\} ([0-9.e+]+)$', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels["upstream"], labels["reason"])] = float(m.group(2))
    return out


@pytest.mark.parametrize("upstream", ["xs", "xh"])
async def test_crosswise_answers_never_reach_the_other_principal(gw: GatewayProcess, upstream: str) -> None:
    before = strays(gw)
    results: dict[str, str] = {}

    async def call(who: str, key: str) -> None:
        async with connect(gw, key) as client:
            results[who] = text(await client.call_tool(f"{upstream}__pair", {"secret": f"{who}-secret"}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "alice", ALICE_KEY)
        tg.start_soon(call, "bob", BOB_KEY)
    assert results == {"alice": "own:alice-secret", "bob": "own:bob-secret"}
    after = strays(gw)
    dropped = {reason: after.get((upstream, reason), 0) - before.get((upstream, reason), 0)
               for reason in ("wrong_stream", "duplicate", "late", "unknown_id")}
    if upstream == "xh":
        # Each call: the partner's id on its own stream, a forgery on the GET stream, a duplicate and 21 guesses
        # there too; everything on the GET stream is stray.
        assert dropped["wrong_stream"] >= 2 * (1 + 1 + 1 + 21)
    else:
        # stdio: each duplicate is late or a duplicate; the guessed counter ids were never sent.
        assert dropped["duplicate"] + dropped["late"] >= 2
        assert dropped["unknown_id"] >= 2 * 21
    logged = [json.loads(line) for line in gw.stderr().splitlines() if "upstream.stray_response" in line]
    assert any(entry.get("upstream") == upstream and entry.get("level") == "warning" for entry in logged)


@pytest.mark.parametrize("method", ["prompts/get", "completion/complete"])
@pytest.mark.parametrize("upstream", ["xs", "xh"])
async def test_what_an_upstream_asks_during_one_callers_request_never_reaches_another_caller(
        gw: GatewayProcess, upstream: str, method: str) -> None:
    """Bob's prompts/get (or completion) makes the upstream ask the client's model about Bob's topic while Alice's
    call, whose client can answer sampling, is in flight. Over stdio nothing says whose request asked: the
    question must not reach Alice, and Alice's model must not answer for Bob."""
    asked_alice: list[str] = []

    async def alice_model(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked_alice.append(str(getattr(params.messages[0].content, "text", "")))
        return types.CreateMessageResult(role="assistant", model="alice-model",
                                         content=types.TextContent(type="text", text="answered by alice"))

    got: dict[str, str] = {}
    async with connect(gw, ALICE_KEY, sampling_callback=alice_model) as alice, connect(gw, BOB_KEY) as bob:
        async def alice_call() -> None:
            got["alice"] = text(await alice.call_tool(f"{upstream}__slow", {"secret": "alice-only", "seconds": 3}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(alice_call)
            await anyio.sleep(0.5)
            if method == "prompts/get":
                prompt = await bob.get_prompt(f"{upstream}__ask", {"topic": "bob-private-topic"})
                got["bob"] = str(getattr(prompt.messages[0].content, "text", ""))
            else:
                done = await bob.complete(types.PromptReference(type="ref/prompt", name=f"{upstream}__ask"),
                                          {"name": "topic", "value": "bob-private-topic"})
                got["bob"] = done.completion.values[0]
    assert asked_alice == []
    assert got["alice"] == "alice-only"
    # The upstream heard that its question could not be relayed, and says so instead of an answer.
    assert got["bob"].startswith("no answer: ") and "alice" not in got["bob"]


@pytest.mark.parametrize("upstream", ["xs", "xh"])
async def test_a_caller_cannot_forge_another_callers_answer_through_a_careless_upstream(
        gw: GatewayProcess, upstream: str) -> None:
    """Bob makes the upstream print JSON-RPC responses for every id a counter would have used, while Alice's call
    is in flight; Alice still gets her own answer."""
    forged = [json.dumps({"jsonrpc": "2.0", "id": i, "result": {
        "content": [{"type": "text", "text": "forged-by-bob"}]}}) for i in range(0, 64)]
    results: dict[str, str] = {}

    async def alice() -> None:
        async with connect(gw, ALICE_KEY) as client:
            results["alice"] = text(await client.call_tool(f"{upstream}__slow",
                                                           {"secret": "alice-only", "seconds": 1.5}))

    async def bob() -> None:
        await anyio.sleep(0.5)
        async with connect(gw, BOB_KEY) as client:
            for line in forged:
                assert text(await client.call_tool(f"{upstream}__echo_raw", {"line": line})) == "echoed"

    async with anyio.create_task_group() as tg:
        tg.start_soon(alice)
        tg.start_soon(bob)
    assert results["alice"] == "alice-only"


async def test_unrelated_upstream_logs_reach_the_sessions_that_asked_at_their_level(gw: GatewayProcess) -> None:
    got: dict[str, list[types.LoggingMessageNotificationParams]] = {"alice": [], "bob": [], "carol": [], "eve": []}

    def collector(who: str) -> Any:
        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            got[who].append(params)
        return on_log

    async with connect(gw, ALICE_KEY, logging_callback=collector("alice")) as alice, \
            connect(gw, BOB_KEY, logging_callback=collector("bob")) as bob, \
            connect(gw, BOB_KEY, logging_callback=collector("carol")) as carol, \
            connect(gw, EVE_KEY, logging_callback=collector("eve")) as eve:
        await alice.set_logging_level("warning")
        await bob.set_logging_level("error")
        await eve.set_logging_level("debug")
        # carol never asks for logging: nothing outside her own calls reaches her.
        await anyio.sleep(0.5)  # the GET streams are open
        for upstream in ("xs", "xh"):
            await carol.call_tool(f"{upstream}__log_later",
                                  {"text": f"disk low on {upstream}, key {LEAKY}", "level": "warning", "delay": 0.2})
        with anyio.fail_after(10):
            while len(got["alice"]) < 2:
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)
    texts = sorted(str(p.data) for p in got["alice"])
    assert [t.split(",")[0] for t in texts] == ["disk low on xh", "disk low on xs"]
    assert all(LEAKY not in t for t in texts)  # sanitized like every other notification
    assert {p.logger for p in got["alice"]} == {"xs", "xh"}  # outside a call, the source is named
    assert got["bob"] == [] and got["carol"] == []
    # eve may see only xh: she hears its messages, never those of an upstream hidden from her.
    assert [str(p.data).split(",")[0] for p in got["eve"]] == ["disk low on xh"]


@pytest.mark.parametrize("upstream", ["xs", "xh"])
async def test_roots_list_outside_any_call_gets_an_empty_list(gw: GatewayProcess, upstream: str) -> None:
    async with connect(gw, ALICE_KEY) as client:
        await client.call_tool(f"{upstream}__ask_roots_later", {"delay": 0.1})
        with anyio.fail_after(10):
            while (answer := text(await client.call_tool(f"{upstream}__roots_answer", {}))) == "none yet":
                await anyio.sleep(0.1)
    assert json.loads(answer) == {"jsonrpc": "2.0", "id": "roots-outside-any-call", "result": {"roots": []}}


@pytest.mark.parametrize("upstream", ["xs", "xh"])
async def test_roots_list_in_a_call_is_the_callers_or_none(gw: GatewayProcess, upstream: str) -> None:
    async def roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///home/alice/project", name="project")])

    async with connect(gw, ALICE_KEY, list_roots_callback=roots) as alice:
        got = json.loads(text(await alice.call_tool(f"{upstream}__roots_in_call", {})))
    assert got["result"]["roots"] == [{"uri": "file:///home/alice/project", "name": "project"}]
    # A caller that did not declare roots is not asked: the upstream hears "none", not "method not found".
    async with connect(gw, BOB_KEY) as bob:
        got = json.loads(text(await bob.call_tool(f"{upstream}__roots_in_call", {})))
    assert got["result"] == {"roots": []}


@pytest.mark.parametrize("upstream", ["xs", "xh"])
async def test_a_log_message_in_a_call_reaches_its_caller_whoever_else_is_calling(
        gw: GatewayProcess, upstream: str) -> None:
    # Three clients (two principals; bob with two sessions) each in a call that logs while all three are in
    # flight. Over Streamable HTTP the message names its call; over stdio nothing does, and each must still hear
    # its own: bastion gives it to every caller in flight rather than guess.
    got: dict[str, list[str]] = {"alice": [], "bob": [], "carol": []}
    keys = {"alice": ALICE_KEY, "bob": BOB_KEY, "carol": BOB_KEY}

    async def call(who: str) -> None:
        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            got[who].append(str(params.data))

        async with connect(gw, keys[who], logging_callback=on_log) as client:
            result = await client.call_tool(f"{upstream}__log_in_call",
                                            {"text": f"from {who}'s call, key {LEAKY}", "delay": 0.5, "after": 0.8})
            assert text(result) == "logged"

    async with anyio.create_task_group() as tg:
        for who in got:
            tg.start_soon(call, who)
    for who in got:
        # Sanitized like every other notification (on stdio once per message, whoever receives it).
        assert all(LEAKY not in text and text.endswith(", key [REDACTED:aws-access-key]") for text in got[who])
        got[who] = [text.removesuffix(", key [REDACTED:aws-access-key]") for text in got[who]]
    for who, heard in got.items():
        assert f"from {who}'s call" in heard, got
        if upstream == "xh":
            assert heard == [f"from {who}'s call"]  # the wire says whose it is: nobody hears another's
        else:
            assert sorted(heard) == sorted(f"from {w}'s call" for w in got)  # once each, none lost
