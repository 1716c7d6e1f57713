"""The 2026-07-28 (stateless) revision on the front door, and bridging between eras, end to end.

bastion runs in front of two stdio upstreams: ``basic`` (a handshake-era server) and ``modern`` (a 2026-07-28
server, pinned with ``era: modern``). Clients are the official SDK 2.x (modern by default, ``mode="legacy"`` for
the handshake era) and a raw HTTP client where exact headers and bodies matter.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.subscriptions import ToolsListChanged

from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.fixtures import hostile_modern_server
from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT, RpcClient, parse_body

V = "2026-07-28"
STATE_KEY = "s" * 40
_ids = itertools.count(100)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("modern")
    process = GatewayProcess({
        "auth": "none",
        "upstreams": {
            "basic": stdio_upstream("tests.fixtures.basic_server"),
            "modern": stdio_upstream("tests.fixtures.modern_server", era="modern"),
        },
    }, workdir, env={"BASTION_STATE_KEY": STATE_KEY}).start()
    yield process
    process.stop()


def modern_body(method: str, params: dict[str, Any] | None = None, *, caps: dict[str, Any] | None = None,
                meta: dict[str, Any] | None = None) -> dict[str, Any]:
    envelope = {"io.modelcontextprotocol/protocolVersion": V,
                "io.modelcontextprotocol/clientCapabilities": caps or {}, **(meta or {})}
    return {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": {**(params or {}), "_meta": envelope}}


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None, *,
         mirror: bool = True) -> httpx.Response:
    hdrs = {"Accept": ACCEPT, "Content-Type": "application/json"}
    if mirror:
        tool_headers = {("region",): "Region"} if body["params"].get("name") == "modern__route" else None
        hdrs.update(request_headers(body["method"], body["params"], V, tool_headers))
    hdrs.update(headers or {})
    return httpx.post(url, content=json.dumps(body), headers=hdrs, timeout=30)


def answer(response: httpx.Response, rid: Any) -> dict[str, Any]:
    found = [m for m in parse_body(response) if m.get("id") == rid]
    assert found, f"HTTP {response.status_code}: {response.text[:300]}"
    return found[-1]


# -- modern client, both upstream eras ---------------------------------------------------------------------


async def test_modern_client_lists_and_uses_tools_prompts_resources_of_both_eras(gw: GatewayProcess) -> None:
    async with Client(gw.url) as client:
        assert client.protocol_version == V
        names = [t.name for t in (await client.list_tools()).tools]
        assert {"basic__echo", "modern__echo", "modern__confirm"} <= set(names)
        assert "modern__bad_header" not in names  # invalid x-mcp-header: dropped at the back door
        assert names == sorted(names)
        assert (await client.call_tool("modern__echo", {"message": "to modern"})).content[0].text == "to modern"
        assert (await client.call_tool("basic__echo", {"message": "to legacy"})).content[0].text == "to legacy"

        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert {"basic__greet", "modern__greet"} <= prompts
        got = await client.get_prompt("modern__greet", {"language": "french"})
        assert got.messages[0].content.text == "Say hello in french"
        got = await client.get_prompt("basic__greet", {"language": "german"})
        assert got.messages[0].content.text == "Say hello in german"

        uris = {str(r.uri) for r in (await client.list_resources()).resources}
        assert {"basic+memo://readme", "modern+memo://readme"} <= uris
        read = await client.read_resource("modern+memo://readme")
        assert read.contents[0].text == "modern contents of memo://readme"
        assert str(read.contents[0].uri) == "modern+memo://readme"
        assert (await client.read_resource("basic+memo://readme")).contents[0].text == "contents of memo://readme"


def test_modern_results_carry_result_type_caching_hints_and_bastions_identity(gw: GatewayProcess) -> None:
    for method, params in (("tools/list", {}), ("prompts/list", {}), ("resources/list", {}),
                           ("resources/read", {"uri": "modern+memo://readme"}), ("server/discover", {})):
        body = modern_body(method, params)
        response = post(gw.url, body, {"Mcp-Session-Id": "ignored", "Last-Event-ID": "ignored"})
        assert response.status_code == 200, response.text
        assert "mcp-session-id" not in response.headers
        result = answer(response, body["id"])["result"]
        assert result["resultType"] == "complete"
        assert result["cacheScope"] == "public" and isinstance(result["ttlMs"], int) and result["ttlMs"] >= 0
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "bastion"
    body = modern_body("tools/call", {"name": "basic__echo", "arguments": {"message": "x"}})
    assert answer(post(gw.url, body), body["id"])["result"]["resultType"] == "complete"


# -- legacy client, modern upstream ------------------------------------------------------------------------


async def test_legacy_client_uses_a_modern_upstream(gw: GatewayProcess) -> None:
    async with Client(gw.url, mode="legacy") as client:
        assert client.protocol_version != V
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"modern__echo", "basic__echo"} <= names
        assert (await client.call_tool("modern__echo", {"message": "old to new"})).content[0].text == "old to new"
        got = await client.get_prompt("modern__greet", {"language": "latin"})
        assert got.messages[0].content.text == "Say hello in latin"
        read = await client.read_resource("modern+memo://readme")
        assert read.contents[0].text == "modern contents of memo://readme"


def test_legacy_clients_never_see_modern_only_fields(gw: GatewayProcess) -> None:
    rpc = RpcClient(gw.url)
    try:
        rpc.initialize()
        for method, params in (("tools/list", None), ("prompts/list", None), ("resources/list", None),
                               ("resources/read", {"uri": "modern+memo://readme"}),
                               ("prompts/get", {"name": "modern__greet", "arguments": {"language": "x"}}),
                               ("tools/call", {"name": "modern__echo", "arguments": {"message": "m"}})):
            result = rpc.request(method, params)["result"]
            assert not {"resultType", "ttlMs", "cacheScope"} & set(result), (method, result)
            assert "io.modelcontextprotocol/serverInfo" not in result.get("_meta", {})
    finally:
        rpc.close()


# -- multi round-trip requests -----------------------------------------------------------------------------


async def test_modern_client_completes_an_input_required_round_trip(gw: GatewayProcess) -> None:
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"sure": True})

    async with Client(gw.url, elicitation_callback=elicit) as client:
        result = await client.call_tool("modern__confirm", {"action": "launch"})
    assert asked == ["Really launch?"]
    assert result.content[0].text == 'confirmed launch: {"sure": true}'


def test_request_state_is_sealed_and_bound_to_the_request(gw: GatewayProcess) -> None:
    caps = {"elicitation": {}}
    first = modern_body("tools/call", {"name": "modern__confirm", "arguments": {"action": "rm"}}, caps=caps)
    result = answer(post(gw.url, first), first["id"])["result"]
    assert result["resultType"] == "input_required"
    assert set(result["inputRequests"]) == {"ok"}
    state = result["requestState"]
    assert state.startswith("bastion.rs1.") and "state-v1:confirm" not in state
    responses = {"ok": {"action": "accept", "content": {"sure": True}}}

    def retry(arguments: dict[str, Any], token: str) -> httpx.Response:
        body = modern_body("tools/call", {"name": "modern__confirm", "arguments": arguments,
                                          "inputResponses": responses, "requestState": token}, caps=caps)
        return post(gw.url, body)

    ok = retry({"action": "rm"}, state)
    assert parse_body(ok)[-1]["result"]["content"][0]["text"] == 'confirmed rm: {"sure": true}'
    for arguments, token, reason in (({"action": "rm -rf /"}, state, "different request"),
                                     ({"action": "rm"}, state[:-3] + ("AAA" if state[-3:] != "AAA" else "BBB"),
                                      "signature"),
                                     ({"action": "rm"}, "state-v1:confirm", "not a requestState")):
        refused = retry(arguments, token)
        assert refused.status_code == 400
        error = parse_body(refused)[-1]["error"]
        assert error["code"] == -32602 and reason in error["message"]


def test_every_part_of_an_upstreams_input_requests_is_cleaned(tmp_path: Path) -> None:
    # Keys, members beside params, _meta: all of it reaches a person or a model, all of it upstream text.
    process = GatewayProcess({"auth": "none", "upstreams": {
        "hostile": stdio_upstream("tests.fixtures.hostile_modern_server", era="modern")}}, tmp_path,
        env={"BASTION_STATE_KEY": STATE_KEY}).start()
    try:
        body = modern_body("tools/call", {"name": "hostile__ask", "arguments": {}}, caps={"elicitation": {}})
        result = answer(post(process.url, body), body["id"])["result"]
    finally:
        process.stop()
    assert result["resultType"] == "input_required"
    shown = json.dumps(result["inputRequests"])
    assert hostile_modern_server.TOKEN not in shown and "\\u001b" not in shown and "\\u0007" not in shown
    [(key, request)] = result["inputRequests"].items()
    assert key.startswith("k") and "[REDACTED:github-token]" in key
    assert request["_meta"]["token"].startswith("[REDACTED")
    assert request["note"].startswith(hostile_modern_server.INJECTION) and "[REDACTED" in request["note"]
    assert "[REDACTED" in request["params"]["message"]


def test_a_completion_reaches_the_upstream_as_bastion_builds_it_and_takes_no_rounds(tmp_path: Path) -> None:
    """completion/complete is no multi round-trip request (only tools/call, prompts/get and resources/read are).
    It was forwarded as the client sent it: the client's own _meta (its capabilities, any key of its own) and a
    requestState of its making reached the upstream, and the upstream's input_required came back with its bare
    state. Now the upstream gets bastion's envelope and no round fields, and input_required is refused."""
    process = GatewayProcess({"auth": "none", "upstreams": {
        "hostile": stdio_upstream("tests.fixtures.hostile_modern_server", era="modern")}}, tmp_path,
        env={"BASTION_STATE_KEY": STATE_KEY}).start()
    ref = {"type": "ref/prompt", "name": "hostile__topic"}
    try:
        body = modern_body("completion/complete", {"ref": ref, "argument": {"name": "subject", "value": "a"},
                                                   "requestState": "made-by-the-client", "inputResponses": {}},
                           caps={"elicitation": {}}, meta={"x-client-key": "forged"})
        values = answer(post(process.url, body), body["id"])["result"]["completion"]["values"]
        insisted = modern_body("completion/complete",
                               {"ref": ref, "argument": {"name": "subject", "value": "insist"}})
        refused = post(process.url, insisted)
        error = answer(refused, insisted["id"])["error"]
    finally:
        process.stop()
    # bastion's envelope only (bastion.upstream.modern.envelope): no key of the client's, no requestState.
    envelope = ("io.modelcontextprotocol/clientCapabilities", "io.modelcontextprotocol/clientInfo",
                "io.modelcontextprotocol/protocolVersion")
    assert values == ["state:None", "meta:" + ",".join(envelope)]
    assert error["code"] == -32603 and "input_required" in error["message"]
    assert "s1" not in refused.text and "which subject" not in refused.text


def test_input_the_client_did_not_declare_is_never_asked_for(gw: GatewayProcess) -> None:
    body = modern_body("tools/call", {"name": "modern__confirm", "arguments": {"action": "x"}})
    response = post(gw.url, body)
    error = answer(response, body["id"])["error"]
    assert response.status_code == 400
    assert error["code"] == -32021 and error["data"] == {"requiredCapabilities": {"elicitation": {}}}


async def test_legacy_client_gets_a_modern_upstreams_input_requests_on_the_call_stream(gw: GatewayProcess) -> None:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"sure": False})

    async with Client(gw.url, mode="legacy", elicitation_callback=elicit) as client:
        result = await client.call_tool("modern__confirm", {"action": "deploy"})
    assert result.is_error is not True
    assert result.content[0].text == 'confirmed deploy: {"sure": false}'


async def test_legacy_client_without_the_capability_gets_a_tool_error(gw: GatewayProcess) -> None:
    async with Client(gw.url, mode="legacy") as client:
        result = await client.call_tool("modern__confirm", {"action": "deploy"})
    assert result.is_error is True
    assert "needs input from the client" in result.content[0].text


async def test_legacy_upstreams_sampling_request_is_refused_for_a_modern_client(gw: GatewayProcess) -> None:
    async with Client(gw.url) as client:
        # The fixture passes bastion's refusal on as its own JSON-RPC error.
        with pytest.raises(Exception, match="cannot be relayed to a 2026-07-28 client"):
            await client.call_tool("basic__ask_llm", {"prompt": "hello?"})


# -- header validation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "drop"), [
    ({"Mcp-Name": "modern__echo"}, None),
    ({"MCP-Protocol-Version": "2025-11-25"}, None),
    ({"Mcp-Method": "tools/list"}, None),
    ({}, "Mcp-Param-Region"),
    ({"Mcp-Param-Region": "us-east"}, None),
])
def test_headers_that_disagree_with_the_body_are_refused(gw: GatewayProcess, change: dict[str, str],
                                                         drop: str | None) -> None:
    body = modern_body("tools/call", {"name": "modern__route", "arguments": {"region": "eu-west"}})
    headers = {"Accept": ACCEPT, "Content-Type": "application/json",
               **request_headers("tools/call", body["params"], V, {("region",): "Region"}), **change}
    headers.pop(drop or "-", None)
    response = httpx.post(gw.url, content=json.dumps(body), headers=headers, timeout=30)
    assert response.status_code == 400
    error = answer(response, body["id"])["error"]
    assert error["code"] == -32020


def test_mirrored_param_headers_pass_and_unknown_ones_are_ignored(gw: GatewayProcess) -> None:
    body = modern_body("tools/call", {"name": "modern__route", "arguments": {"region": "eu-west"}})
    response = post(gw.url, body, {"Mcp-Param-Whatever": "x"})
    assert response.status_code == 200
    assert answer(response, body["id"])["result"]["resultType"] == "complete"


def test_header_check_comes_before_the_version_check(gw: GatewayProcess) -> None:
    body = modern_body("tools/list")
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2099-01-01"
    mismatched = post(gw.url, body)
    assert answer(mismatched, body["id"])["error"]["code"] == -32020
    unsupported = post(gw.url, body, {"MCP-Protocol-Version": "2099-01-01"})
    assert unsupported.status_code == 400
    assert answer(unsupported, body["id"])["error"]["code"] == -32022


# -- logging -----------------------------------------------------------------------------------------------


def test_log_messages_only_for_requests_asking_and_only_on_their_stream(gw: GatewayProcess) -> None:
    quiet = modern_body("tools/call", {"name": "modern__chatty", "arguments": {}})
    messages = parse_body(post(gw.url, quiet))
    assert [m.get("method") for m in messages] == [None]
    loud = modern_body("tools/call", {"name": "modern__chatty", "arguments": {}},
                       meta={"io.modelcontextprotocol/logLevel": "info"})
    response = post(gw.url, loud)
    assert response.headers["content-type"].startswith("text/event-stream")
    logs = [m["params"]["data"] for m in parse_body(response) if m.get("method") == "notifications/message"]
    assert logs == ["chatty at info"]
    assert answer(response, loud["id"])["result"]["content"][0]["text"] == "chatted"


# -- subscriptions/listen ----------------------------------------------------------------------------------


async def test_list_changes_reach_a_listening_modern_client(gw: GatewayProcess) -> None:
    async with Client(gw.url) as client, client.listen(tools_list_changed=True) as subscription:
        assert subscription.honored.tools_list_changed is True
        assert not subscription.honored.prompts_list_changed
        grown = await client.call_tool("modern__grow", {})
        with anyio.fail_after(20):
            event = await subscription.__anext__()
        assert isinstance(event, ToolsListChanged)
        names = {t.name for t in (await client.list_tools()).tools}
    assert "modern__" + grown.content[0].text in names


def test_listen_stream_acknowledges_first_and_tags_every_message(gw: GatewayProcess) -> None:
    body = modern_body("subscriptions/listen", {"notifications": {"toolsListChanged": True,
                                                                  "resourceSubscriptions": ["nope://x"]}})
    headers = {"Accept": ACCEPT, "Content-Type": "application/json",
               **request_headers("subscriptions/listen", body["params"], V)}
    with httpx.Client(timeout=30) as http, http.stream("POST", gw.url, content=json.dumps(body),
                                                       headers=headers) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert "mcp-session-id" not in stream.headers
        lines = stream.iter_lines()
        seen: list[dict[str, Any]] = []
        for line in lines:
            if line.startswith("data:"):
                seen.append(json.loads(line[5:]))
                if len(seen) == 1:
                    call = modern_body("tools/call", {"name": "basic__grow", "arguments": {}})
                    assert post(gw.url, call).status_code == 200
                if len(seen) == 2:
                    break
    ack, change = seen
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"toolsListChanged": True}  # unknown resource: not honoured
    assert change["method"] == "notifications/tools/list_changed"
    for message in seen:
        assert message["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == body["id"]


def test_listen_requires_an_event_stream(gw: GatewayProcess) -> None:
    body = modern_body("subscriptions/listen", {"notifications": {"toolsListChanged": True}})
    assert post(gw.url, body, {"Accept": "application/json"}).status_code == 406


def test_a_session_unsubscribing_keeps_a_listen_streams_upstream_subscription(tmp_path: Path) -> None:
    """One upstream subscription serves a legacy session and a 2026-07-28 listen stream of the same replica:
    the session's resources/unsubscribe must not drop it while the stream still listens; the stream's close
    does."""
    record = tmp_path / "upstream.jsonl"
    process = GatewayProcess({"auth": "none", "upstreams": {
        "basic": stdio_upstream("tests.fixtures.basic_server", "--record", str(record))}}, tmp_path).start()
    uri = "basic+memo://readme"

    def seen() -> list[dict[str, Any]]:
        lines = record.read_text().splitlines() if record.exists() else []
        return [doc for doc in map(json.loads, lines) if "subscribe" in doc or "unsubscribe" in doc]

    try:
        legacy = RpcClient(process.url)
        legacy.initialize()
        body = modern_body("subscriptions/listen", {"notifications": {"resourceSubscriptions": [uri]}})
        headers = {"Accept": ACCEPT, "Content-Type": "application/json",
                   **request_headers("subscriptions/listen", body["params"], V)}
        with httpx.Client(timeout=30) as http, http.stream("POST", process.url, content=json.dumps(body),
                                                           headers=headers) as stream:
            lines = stream.iter_lines()  # kept: dropping a half-read iterator closes the response
            ack = json.loads(next(line for line in lines if line.startswith("data:"))[5:])
            assert ack["params"]["notifications"] == {"resourceSubscriptions": [uri]}
            assert legacy.request("resources/subscribe", {"uri": uri})["result"] == {}
            assert legacy.request("resources/unsubscribe", {"uri": uri})["result"] == {}
            # The listen stream still holds the resource: nothing was unsubscribed upstream.
            assert seen() == [{"subscribe": "memo://readme"}, {"subscribe": "memo://readme"}]
        deadline = time.monotonic() + 10
        while seen()[-1:] != [{"unsubscribe": "memo://readme"}] and time.monotonic() < deadline:
            time.sleep(0.05)
        # The stream closed and nobody else wants the resource: now it is released upstream, once.
        assert seen() == [{"subscribe": "memo://readme"}, {"subscribe": "memo://readme"},
                          {"unsubscribe": "memo://readme"}]
        legacy.close()
    finally:
        process.stop()
