"""A hostile upstream's definitions, results, errors and notifications, through the running gateway.

The official SDK is the client; the audit log (stdout) is read back to prove an admin sees what was tried.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

from bastion.sanitize.shape import omitted_marker
from tests.e2e.conftest import stdio_upstream
from tests.fixtures import hostile_definitions_server as hostile
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient

MAX_BLOCKS = 1000  # the default of sanitize.max_content_blocks


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("hostile-defs")
    gw = GatewayProcess({
        "auth": "none",
        "upstreams": {
            "defs": stdio_upstream("tests.fixtures.hostile_definitions_server"),
            "basic": stdio_upstream("tests.fixtures.basic_server"),
        },
        # Refreshes every second: findings must still be audited once, not once per refresh.
        "catalogue": {"refresh_interval": "1s"},
    }, workdir).start()
    yield gw
    gw.stop()


def dump(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    return out


def findings(gw: GatewayProcess, item: str) -> set[tuple[str, str, str]]:
    return {(r["item_kind"], r["class"], r["action"]) for r in gw.records("definition.finding")
            if r["upstream"] == "defs" and r["item"] == item}


async def test_poisoned_tool_definitions_are_neutralised_blocked_and_audited(gw: GatewayProcess) -> None:
    async with Client(gw.url, mode="legacy") as client:
        tools = {t.name: dump(t) for t in (await client.list_tools()).tools}

    steer = tools["defs__steer"]["description"]
    assert '[bastion: possible prompt injection: "\u2039IMPORTANT\u203a"]' in steer
    assert '[bastion: reference to a tool of another server: "basic__echo"]' in steer
    # An instruction smuggled into an enum cannot be rewritten without changing what the tool accepts: blocked.
    assert "defs__enum_smuggler" not in tools
    poison = tools["defs__schema_poison"]["inputSchema"]
    query = poison["properties"]["query"]
    assert query["description"].startswith('The query. [bastion: possible prompt injection: "Ignore all')
    # neutralise says in the text that something was hidden there
    assert query["title"] == "Query [bastion: hidden characters removed]"
    assert query["examples"] == ["notes about cats [bastion: hidden characters removed]"]
    assert poison["properties"]["api_key"]["default"] == "[REDACTED:key-name]"
    assert poison["required"] == ["query"]
    assert tools["defs__iconic"]["icons"] == [hostile.GOOD_ICON, hostile.PNG_ICON]
    text = json.dumps(tools, ensure_ascii=False)
    assert hostile.CREDENTIAL_DEFAULT not in text and "\u202e" not in text and "javascript:" not in text

    assert {("tool", "directive_tag", "neutralised"), ("tool", "cross_tool_reference", "neutralised")} \
        <= findings(gw, "steer")
    assert ("tool", "hidden_instruction", "blocked") in findings(gw, "enum_smuggler")
    assert {("tool", "secret", "neutralised"), ("tool", "injection", "neutralised"),
            ("tool", "invisible_characters", "neutralised")} <= findings(gw, "schema_poison")
    assert ("tool", "unsafe_url", "neutralised") in findings(gw, "iconic")
    drops = {(r["item_kind"], r["item"], r["action"]) for r in gw.records("catalogue.drop")}
    assert ("tool", "enum_smuggler", "quarantined") in drops


async def test_a_blocked_tool_cannot_be_called(gw: GatewayProcess) -> None:
    rpc = RpcClient(gw.url)
    rpc.initialize()
    try:
        assert rpc.call("defs__enum_smuggler", {"speed": "slow"})["error"]["code"] == -32602
    finally:
        rpc.close()


async def test_prompts_resources_templates_and_instructions(gw: GatewayProcess) -> None:
    async with Client(gw.url, mode="legacy") as client:
        instructions = client.instructions
        prompts = {p.name: dump(p) for p in (await client.list_prompts()).prompts}
        resources = {r.uri: dump(r) for r in (await client.list_resources()).resources}
        templates = [dump(t) for t in (await client.list_resource_templates()).resource_templates]

    assert instructions is not None
    assert "[defs] Use these tools for notes. [bastion: hidden characters removed]" in instructions
    assert "\U000e0069" not in instructions
    summarise = prompts["defs__summarise"]
    assert '[bastion: possible prompt injection: "\u2039system\u203a"]' in summarise["description"]
    assert [(a["name"], a["description"]) for a in summarise["arguments"]] == \
        [("topic", "the topic [bastion: hidden characters removed]")]
    assert "defs__smuggled_arg" not in prompts  # an argument name cannot be rewritten: blocked
    index = resources["defs+notes://index"]
    assert "[bastion: possible prompt injection:" in index["description"]
    assert "icons" not in index or index["icons"] == []
    assert not [u for u in resources if "javascript" in u]
    assert [t["description"] for t in templates if t["uriTemplate"] == "defs+notes://{id}"] == \
        ["A note by id. [bastion: hidden characters removed]"]

    drops = {(r["item_kind"], r["item"], r["action"]) for r in gw.records("catalogue.drop")}
    assert {("prompt", "smuggled_arg", "dropped"), ("resource", "javascript:alert(1)", "dropped")} <= drops
    assert ("instructions", "hidden_instruction", "neutralised") in findings(gw, "instructions")
    assert ("prompt", "directive_tag", "neutralised") in findings(gw, "summarise")


async def test_findings_are_audited_once_not_on_every_refresh(gw: GatewayProcess) -> None:
    first = gw.wait_records("definition.finding", 1)
    assert first
    time.sleep(3.5)  # three periodic refreshes at 1 s
    records = gw.records("definition.finding")
    keys = [(r["item_kind"], r["item"], r["class"]) for r in records]
    assert len(keys) == len(set(keys)), "a finding was audited twice"
    drops = [(r["item_kind"], r["item"]) for r in gw.records("catalogue.drop")]
    assert len(drops) == len(set(drops)), "a drop was audited twice"


@pytest.mark.parametrize(("tool", "problem"), [
    ("bad_is_error", "'isError' is a string, not a boolean"),
    ("bad_content", "'content' is an object, not a list"),
    ("unknown_block", 'content[1] has an unknown type ("video")'),
    ("bad_structured", "'structuredContent' is a list, not an object"),
])
async def test_malformed_results_become_well_formed_errors(gw: GatewayProcess, tool: str, problem: str) -> None:
    async with Client(gw.url, mode="legacy") as client:
        result = await client.call_tool(f"defs__{tool}", {})
    assert result.is_error is True
    assert isinstance(result.content[0], types.TextContent)
    assert result.content[0].text == f"The upstream returned a malformed result: {problem}"
    calls = [r for r in gw.wait_records("tool.call", 1) if r["tool"]["original"] == tool]
    assert calls and calls[-1]["outcome"] == "malformed_result" and calls[-1]["stage"] == "result_shape"
    assert calls[-1]["reason"] == f"The upstream returned a malformed result: {problem}"


async def test_a_result_of_200000_blocks_is_cut_with_a_marker(gw: GatewayProcess) -> None:
    async with Client(gw.url, mode="legacy", read_timeout_seconds=60) as client:
        result = await client.call_tool("defs__many_blocks", {})
    assert result.is_error is not True
    assert len(result.content) == MAX_BLOCKS + 1
    assert dump(result.content[-1]) == omitted_marker(hostile.BLOCKS - MAX_BLOCKS, MAX_BLOCKS)
    calls = [r for r in gw.records("tool.call") if r["tool"]["original"] == "many_blocks"]
    assert calls[-1]["sanitize"]["content_blocks_omitted"] == hostile.BLOCKS - MAX_BLOCKS
    assert calls[-1]["result"]["content_items"] == MAX_BLOCKS + 1
    assert "sanitize.content_blocks_omitted" in gw.stderr()


def test_meta_annotations_and_icons_in_results_are_sanitized(gw: GatewayProcess) -> None:
    # The raw client: the SDK's models would drop the unknown annotation field before the test could see it.
    rpc = RpcClient(gw.url)
    rpc.initialize()
    try:
        result = rpc.call("defs__meta_result", {})["result"]
    finally:
        rpc.close()
    assert result["_meta"] == {"api_key": "[REDACTED:key-name]", "trace": "xy"}
    text, link = result["content"]
    assert text["annotations"]["note"] == "ab"
    assert link["icons"] == [hostile.GOOD_ICON]
    call = [r for r in gw.records("tool.call") if r["tool"]["original"] == "meta_result"][-1]
    assert call["outcome"] == "sanitized"
    assert call["sanitize"]["unsafe_url"] == 3
    assert call["sanitize"]["injection:ignore-previous"] == 1  # flagged in _meta (default injection: flag)


def test_upstream_errors_lose_stack_traces_and_named_credentials(gw: GatewayProcess) -> None:
    rpc = RpcClient(gw.url)
    rpc.initialize()
    try:
        error = rpc.call("defs__leaky_error", {})["error"]
    finally:
        rpc.close()
    line = "DbError: could not connect to the notes database [bastion: stack trace removed]"
    assert error["message"] == line
    assert error["data"] == {"AWS_SECRET_ACCESS_KEY": "[REDACTED:key-name]",
                             "detail": {"password": "[REDACTED:key-name]", "host": "db"},
                             "stack": line, "note": "see"}
    assert hostile.FAKE_AWS_SECRET not in json.dumps(error)


async def test_notifications_prompt_messages_resource_contents_and_completions(gw: GatewayProcess) -> None:
    logged: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params)

    async with Client(gw.url, mode="legacy", logging_callback=on_log) as client:
        await client.call_tool("defs__noisy", {})
        prompt = dump(await client.get_prompt("defs__summarise", {"topic": "cats"}))
        read = dump(await client.read_resource("defs+notes://index"))
        completion = dump(await client.complete(types.PromptReference(type="ref/prompt", name="defs__summarise"),
                                                {"name": "topic", "value": "c"}))
    assert logged
    log_params = dump(logged[-1])
    assert log_params["data"] == {"password": "[REDACTED:key-name]", "msg": "xy"}
    assert log_params.get("_meta", {}).get("token") in (None, "[REDACTED:key-name]")
    assert prompt["description"] == "Summary prompt"
    assert prompt["messages"][0]["content"]["text"] == "Summarise red notes"
    assert prompt["messages"][0]["content"]["_meta"] == {"secret": "[REDACTED:key-name]"}
    assert prompt["_meta"] == {"note": "ab"}
    assert read["contents"][0]["text"] == "note body"
    assert read["contents"][0]["_meta"] == {"api_key": "[REDACTED:key-name]"}
    assert read["contents"][0]["uri"] == "defs+notes://index"
    assert completion["completion"]["values"] == ["cats", "dogs"]
