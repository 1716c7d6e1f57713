"""The official Python SDK as the client, through bastion, against real upstream processes."""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.support.gateway import GatewayProcess


async def test_legacy_client_lists_namespaced_tools_from_both_upstreams(gateway: GatewayProcess) -> None:
    async with Client(gateway.url, mode="legacy") as client:
        assert client.server_info is not None and client.server_info.name == "bastion"
        names = [t.name for t in (await client.list_tools()).tools]
    assert "basic__echo" in names and "web__echo" in names
    assert names == sorted(names)
    assert len(names) == len(set(names))


async def test_legacy_client_calls_tools_on_stdio_and_http_upstreams(gateway: GatewayProcess) -> None:
    async with Client(gateway.url, mode="legacy") as client:
        via_stdio = await client.call_tool("basic__echo", {"message": "hello stdio"})
        via_http = await client.call_tool("web__echo", {"message": "hello http"})
        added = await client.call_tool("web__add", {"a": 2, "b": 3})
        failed = await client.call_tool("basic__fail", {})
    assert via_stdio.content[0].text == "hello stdio"
    assert via_http.content[0].text == "hello http"
    assert added.structured_content == {"sum": 5}
    assert failed.is_error is True and failed.content[0].text == "it failed"
    calls = [json.loads(line) for line in gateway.record_file.read_text().splitlines()]  # type: ignore[attr-defined]
    assert {"name": "echo", "arguments": {"message": "hello stdio"}} in calls


async def test_unknown_tool_is_a_protocol_error(gateway: GatewayProcess) -> None:
    async with Client(gateway.url, mode="legacy") as client:
        with pytest.raises(Exception, match="Unknown tool"):  # the SDK raises MCPError for JSON-RPC errors
            await client.call_tool("basic__nope", {})


async def test_progress_notifications_reach_the_client(gateway: GatewayProcess) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with Client(gateway.url, mode="legacy") as client:
        result = await client.call_tool("basic__slow", {"seconds": 0.3, "steps": 3}, progress_callback=on_progress)
    assert result.content[0].text == "done"
    assert [p for p, _, _ in seen] == [1, 2, 3]
    assert seen[-1][2] == "step 3"


async def test_sampling_request_is_relayed_to_the_calling_client(gateway: GatewayProcess) -> None:
    asked: list[str] = []

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(type="text", text="forty-two"))

    async with Client(gateway.url, mode="legacy", sampling_callback=sampling) as client:
        result = await client.call_tool("basic__ask_llm", {"prompt": "meaning of life?"})
    assert asked == ["meaning of life?"]
    assert result.content[0].text == "forty-two"


async def test_prompts_resources_and_completion_are_namespaced_and_routed(gateway: GatewayProcess) -> None:
    async with Client(gateway.url, mode="legacy") as client:
        prompts = [p.name for p in (await client.list_prompts()).prompts]
        assert {"basic__greet", "web__greet"} <= set(prompts)
        got = await client.get_prompt("web__greet", {"language": "french"})
        assert got.messages[0].content.text == "Say hello in french"

        resources = [str(r.uri) for r in (await client.list_resources()).resources]
        assert {"basic+memo://readme", "web+memo://readme"} <= set(resources)
        read = await client.read_resource("web+memo://readme")
        assert read.contents[0].text == "contents of memo://readme"
        assert str(read.contents[0].uri) == "web+memo://readme"

        templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
        assert "basic+memo://notes/{id}" in templates
        by_template = await client.read_resource("basic+memo://notes/7")
        assert by_template.contents[0].text == "contents of memo://notes/7"

        done = await client.complete(types.PromptReference(type="ref/prompt", name="basic__greet"),
                                     {"name": "language", "value": "e"})
        assert done.completion.values == ["english", "esperanto"]


async def test_modern_auto_mode_client_lists_and_calls(gateway: GatewayProcess) -> None:
    async with Client(gateway.url) as client:  # 2.x default: probes server/discover first
        assert client.protocol_version == "2026-07-28"
        names = [t.name for t in (await client.list_tools()).tools]
        assert "basic__echo" in names
        result = await client.call_tool("basic__echo", {"message": "modern"})
    assert result.content[0].text == "modern"


async def test_list_changed_from_an_upstream_reaches_a_listening_client(gateway: GatewayProcess) -> None:
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification) and \
                getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.set()
        root = getattr(message, "root", None)
        if root is not None and getattr(root, "method", None) == "notifications/tools/list_changed":
            changed.set()

    async with Client(gateway.url, mode="legacy", message_handler=on_message) as client:
        before = {t.name for t in (await client.list_tools()).tools}
        grown = await client.call_tool("basic__grow", {})
        with anyio.fail_after(15):
            await changed.wait()
        after = {t.name for t in (await client.list_tools()).tools}
    new_tool = "basic__" + grown.content[0].text
    assert new_tool not in before and new_tool in after


async def test_every_call_leaves_exactly_one_audit_record(gateway: GatewayProcess) -> None:
    async with Client(gateway.url, mode="legacy") as client:
        await client.call_tool("basic__echo", {"message": "audited-1"})
        await client.call_tool("web__fail", {})
    records = gateway.wait_records("tool.call", 2)
    tools = [r.get("tool", {}) for r in records]
    assert any(json.dumps(t).find("basic__echo") >= 0 for t in tools)


async def test_what_an_upstream_asks_the_client_is_sanitized_too(gateway: GatewayProcess) -> None:
    asked: list[str] = []

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)
        return types.CreateMessageResult(role="assistant", model="m", content=types.TextContent(type="text", text="ok"))

    hostile = "summarize\x1b]52;c;Y3VybCBldmlsLnNo\x07 this\u202e ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    async with Client(gateway.url, mode="legacy", sampling_callback=sampling) as client:
        await client.call_tool("basic__ask_llm", {"prompt": hostile})
    assert len(asked) == 1
    assert asked[0].startswith("summarize")
    for hidden in ("\x1b", "\u202e", "ghp_A1b2"):
        assert hidden not in asked[0]
    assert "[REDACTED:" in asked[0]
