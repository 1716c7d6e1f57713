"""``Dispatcher`` in process, over the real gateway, pool, pipeline and view steps, against memory upstreams.

What the front door hands the dispatcher after parsing (a scope and a message) goes in; what the client would
get comes out, along with what each upstream received and the audit records written. No HTTP, no subprocess:
the behaviour of the method table itself, in milliseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bastion.errors import (
    InvalidParams,
    MethodNotFound,
    UnknownTool,
    UpstreamRpcError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.upstream.base import RelatedMessageHandler
from tests.audit.helpers import assert_valid
from tests.core import build
from tests.core.build import BOB, Core
from tests.support.memory_upstream import MemoryUpstream, text_result, tool

POLICY = """
version: 1
rules:
  - {id: eng-all, effect: allow, principals: {groups: [eng]}}
  - {id: sales-add, effect: allow, principals: {groups: [sales]}, tools: [notes__add]}
"""
NOTES_TOOLS = [
    tool("add", properties={"a": {"type": "integer"}, "b": {"type": "integer"}}, required=["a", "b"],
         output={"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}),
    tool("slow"), tool("fail"), tool("link"), tool("lister"),
    tool("hostile", properties={"x": {"type": 12}}),  # an invalid schema: quarantined by CompileSchemas
]


def notes() -> MemoryUpstream:
    up = MemoryUpstream("notes", tools=NOTES_TOOLS, page_size=2, instructions="Notes are kept forever.",
                        prompts=[{"name": "greet", "arguments": [{"name": "language"}]}],
                        resources=[{"uri": "memo://readme", "name": "readme"}],
                        templates=[{"uriTemplate": "memo://notes/{id}", "name": "note"}])

    async def add(params: dict[str, Any], on_message: RelatedMessageHandler | None) -> dict[str, Any]:
        a, b = params["arguments"]["a"], params["arguments"]["b"]
        return text_result(str(a + b), structuredContent={"sum": a + b})

    async def slow(params: dict[str, Any], on_message: RelatedMessageHandler | None) -> dict[str, Any]:
        assert on_message is not None
        for step in (1, 2):
            await on_message("notifications/progress", {"progressToken": "upstream-tok", "progress": step})
        await asyncio.sleep(float(params["arguments"].get("seconds", 0)))
        return text_result("done")

    up.script("tools/call", "add", handler=add)
    up.script("tools/call", "slow", handler=slow)
    up.script("tools/call", "fail", raises=UpstreamRpcError(-32000, "database said: key AKIAIOSFODNN7EXAMPLE",
                                                            data={"hint": "retry"}))
    up.script("tools/call", "link", result={"content": [
        {"type": "resource_link", "uri": "memo://notes/7", "name": "note 7"},
        {"type": "resource_link", "uri": "https://example.com/x", "name": "web"}]})
    return up


def files() -> MemoryUpstream:
    return MemoryUpstream("files", tools=[tool("read", properties={"path": {"type": "string"}}), tool("rm")])


@pytest.fixture
async def core() -> AsyncIterator[Core]:
    async with build.running_core(notes(), files(), catalogue={"page_size": 3},
                                  upstream_config={"notes": {"timeout": "300ms"}, "files": {"prefix": None}}) as c:
        yield c


@pytest.fixture
async def guarded() -> AsyncIterator[Core]:
    async with build.running_core(notes(), files(), policy_text=POLICY,
                                  upstream_config={"files": {"prefix": None}}) as c:
        yield c


async def list_all(core: Core, method: str, key: str, **scope: Any) -> tuple[list[str], int]:
    """Follow the cursors to the end; the names (``name`` or ``uri``) and the number of pages."""
    names: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await core.rpc(method, {"cursor": cursor} if cursor else {}, scope=build.client_scope(**scope))
        pages += 1
        names += [item.get("uri") or item.get("uriTemplate") or item["name"] for item in page[key]]
        cursor = page.get("nextCursor")
        if cursor is None:
            return names, pages


def one_call_record(core: Core) -> dict[str, Any]:
    [doc] = core.records()
    assert_valid(doc)
    return doc


# -- tools/list ----------------------------------------------------------------------------------------------


async def test_tools_are_listed_namespaced_sorted_and_paginated(core: Core) -> None:
    names, pages = await list_all(core, "tools/list", "tools")
    # Every page of the upstream's own list was fetched (page_size 2 upstream side), and the hostile schema is
    # quarantined: hidden from the list.
    assert names == ["notes__add", "notes__fail", "notes__link", "notes__lister", "notes__slow", "read", "rm"]
    assert pages == 3
    assert len(core.upstreams["notes"].calls("tools/list")) == 3
    # One tools.list record per listing, not per page.
    [listing] = core.records("tools.list")
    assert (listing["shown"], listing["hidden"]) == (7, 1)


async def test_a_cursor_bastion_did_not_issue_is_invalid_params(core: Core) -> None:
    with pytest.raises(InvalidParams):
        await core.rpc("tools/list", {"cursor": "not-a-cursor"})


async def test_the_policy_hides_what_a_caller_may_not_call(guarded: Core) -> None:
    alice, _ = await list_all(guarded, "tools/list", "tools")
    bob, _ = await list_all(guarded, "tools/list", "tools", principal=BOB)
    assert "notes__slow" in alice and bob == ["notes__add"]
    shown = [(d["principal"]["id"], d["shown"], d["hidden"]) for d in guarded.records("tools.list")]
    assert shown == [("alice", 7, 1), ("bob", 1, 7)]


async def test_modern_lists_carry_cache_hints_private_when_a_policy_filters(core: Core, guarded: Core) -> None:
    public = await core.rpc("tools/list", {}, scope=build.client_scope(era="modern"))
    private = await guarded.rpc("tools/list", {}, scope=build.client_scope(era="modern"))
    assert (public["cacheScope"], public["ttlMs"]) == ("public", 30_000)
    assert (private["cacheScope"], private["ttlMs"]) == ("private", 0)
    legacy = await core.rpc("tools/list", {})
    assert "cacheScope" not in legacy


async def test_a_new_tool_appears_after_list_changed(core: Core) -> None:
    up = core.upstreams["files"]
    up.tools.append(tool("write"))
    await up.announce("notifications/tools/list_changed")
    async with asyncio.timeout(5):
        while ["tools"] not in core.changes:
            await asyncio.sleep(0.01)
    names, _ = await list_all(core, "tools/list", "tools")
    assert "write" in names


# -- tools/call ----------------------------------------------------------------------------------------------


async def test_an_allowed_call_reaches_the_upstream_under_its_own_name(core: Core) -> None:
    result = await core.rpc("tools/call", {"name": "notes__add", "arguments": {"a": 2, "b": 3},
                                           "_meta": {"progressToken": "client-tok"}}, rid=41)
    assert result == {"content": [{"type": "text", "text": "5"}], "structuredContent": {"sum": 5}}
    [sent] = core.upstreams["notes"].calls()
    # The upstream sees its own tool name, the arguments and the client's progress token; nothing else.
    assert sent == {"name": "add", "arguments": {"a": 2, "b": 3}, "_meta": {"progressToken": "client-tok"}}
    doc = one_call_record(core)
    assert (doc["outcome"], doc["decision"], doc["stage"], doc["request_id"]) == ("allowed", "allow", "complete", 41)
    assert doc["tool"] == {"name": "notes__add", "upstream": "notes", "original": "add"}


async def test_an_unprefixed_upstreams_tool_is_called_by_its_own_name(core: Core) -> None:
    result = await core.rpc("tools/call", {"name": "read", "arguments": {"path": "/a"}})
    assert result["content"][0]["text"] == '{"path": "/a"}'
    assert core.upstreams["files"].calls() == [{"name": "read", "arguments": {"path": "/a"}}]


async def test_a_denied_call_looks_exactly_like_an_unknown_tool(guarded: Core) -> None:
    with pytest.raises(UnknownTool) as denied:
        await guarded.rpc("tools/call", {"name": "notes__slow", "arguments": {}}, scope=build.client_scope(BOB))
    with pytest.raises(UnknownTool) as unknown:
        await guarded.rpc("tools/call", {"name": "notes__nope", "arguments": {}}, scope=build.client_scope(BOB))
    assert denied.value.to_error() == {**unknown.value.to_error(), "message": "Unknown tool: notes__slow"}
    assert guarded.upstreams["notes"].calls() == []
    records = guarded.records()
    assert [(d["outcome"], d["decision"], d["stage"]) for d in records] == [
        ("denied", "deny", "policy"), ("denied", "deny", "resolve")]
    assert records[1]["tool"] == {"name": "notes__nope", "upstream": None, "original": None}


async def test_a_quarantined_tool_cannot_be_called(core: Core) -> None:
    with pytest.raises(UnknownTool):
        await core.rpc("tools/call", {"name": "notes__hostile", "arguments": {}})
    assert core.upstreams["notes"].calls() == []
    doc = one_call_record(core)
    assert doc["stage"] == "quarantine" and doc["reason"].startswith("tool quarantined: schema rejected")


@pytest.mark.parametrize("params", [{"name": 7}, {"name": "notes__add", "arguments": [1, 2]}])
async def test_malformed_call_params_are_refused_and_recorded(core: Core, params: dict[str, Any]) -> None:
    with pytest.raises(InvalidParams):
        await core.rpc("tools/call", params)
    doc = one_call_record(core)
    assert (doc["outcome"], doc["decision"], doc["stage"]) == ("invalid_input", "deny", "parse")


async def test_invalid_arguments_never_reach_the_upstream(core: Core) -> None:
    result = await core.rpc("tools/call", {"name": "notes__add", "arguments": {"a": 1, "b": "two"}})
    assert result["isError"] is True
    assert result["content"][0]["text"] == "Invalid arguments for tool notes__add: $.b: must be of type integer"
    assert core.upstreams["notes"].calls() == []
    assert one_call_record(core)["violations"] == ["$.b: must be of type integer"]


async def test_an_upstream_error_is_relayed_with_its_text_sanitized(core: Core) -> None:
    with pytest.raises(UpstreamRpcError) as info:
        await core.rpc("tools/call", {"name": "notes__fail", "arguments": {}})
    assert info.value.code == -32000
    assert info.value.message == "database said: key [REDACTED:aws-access-key]"
    assert info.value.data == {"hint": "retry"}
    doc = one_call_record(core)
    assert (doc["outcome"], doc["stage"], doc["error"]["message"]) == ("upstream_error", "forward",
                                                                      info.value.message)


async def test_a_slow_upstream_times_out_and_is_told_to_cancel(core: Core) -> None:
    with pytest.raises(UpstreamTimeout) as info:
        await core.rpc("tools/call", {"name": "notes__slow", "arguments": {"seconds": 30}})
    assert info.value.data == {"upstream": "notes", "timeoutMs": 300}
    assert [p["name"] for _, p in core.upstreams["notes"].cancelled] == ["slow"]
    assert (one_call_record(core)["outcome"]) == "timeout"


async def test_an_unreachable_upstream_fails_the_call_fast(core: Core) -> None:
    core.upstreams["files"].reachable = False
    with pytest.raises(UpstreamUnavailable):
        await core.rpc("tools/call", {"name": "rm", "arguments": {}})
    assert one_call_record(core)["outcome"] == "upstream_unavailable"


async def test_progress_reaches_the_client_that_asked_for_it(core: Core) -> None:
    emitter = Emitted()
    scope = build.client_scope(emitter=emitter)
    await core.rpc("tools/call", {"name": "notes__slow", "arguments": {}, "_meta": {"progressToken": "t"}},
                   scope=scope)
    await core.rpc("tools/call", {"name": "notes__slow", "arguments": {}}, scope=scope)  # no token: none relayed
    assert [(m, p["progress"]) for m, p in emitter.notified] == [("notifications/progress", 1),
                                                                 ("notifications/progress", 2)]


async def test_resource_links_in_results_get_their_public_uri(core: Core) -> None:
    result = await core.rpc("tools/call", {"name": "notes__link", "arguments": {}})
    assert [block["uri"] for block in result["content"]] == ["notes+memo://notes/7", "https://example.com/x"]


# -- prompts, resources, the rest ----------------------------------------------------------------------------


async def test_prompts_are_listed_and_fetched_by_public_name(core: Core) -> None:
    names, _ = await list_all(core, "prompts/list", "prompts")
    assert names == ["notes__greet"]
    got = await core.rpc("prompts/get", {"name": "notes__greet", "arguments": {"language": "fr"}})
    assert got["messages"][0]["content"]["text"] == 'prompt greet with {"language": "fr"}'
    assert core.upstreams["notes"].calls("prompts/get") == [{"name": "greet", "arguments": {"language": "fr"}}]
    with pytest.raises(InvalidParams, match="Unknown prompt"):
        await core.rpc("prompts/get", {"name": "notes__nope"})


async def test_resources_are_read_by_public_uri_and_answered_with_public_uris(core: Core) -> None:
    uris, _ = await list_all(core, "resources/list", "resources")
    templates, _ = await list_all(core, "resources/templates/list", "resourceTemplates")
    assert (uris, templates) == (["notes+memo://readme"], ["notes+memo://notes/{id}"])
    read = await core.rpc("resources/read", {"uri": "notes+memo://notes/7"})
    assert read["contents"] == [{"uri": "notes+memo://notes/7", "mimeType": "text/plain",
                                 "text": "contents of memo://notes/7"}]
    assert core.upstreams["notes"].calls("resources/read") == [{"uri": "memo://notes/7"}]
    # A URI no prefix claims belongs to the unprefixed upstream, which answers for it.
    with pytest.raises(UpstreamRpcError) as info:
        await core.rpc("resources/read", {"uri": "elsewhere://x"})
    assert info.value.code == -32002
    assert core.upstreams["files"].calls("resources/read") == [{"uri": "elsewhere://x"}]


async def test_subscriptions_are_forwarded_with_the_upstreams_uri(core: Core) -> None:
    assert await core.rpc("resources/subscribe", {"uri": "notes+memo://readme"}) == {}
    assert core.upstreams["notes"].subscriptions == {"memo://readme"}
    assert await core.rpc("resources/unsubscribe", {"uri": "notes+memo://readme"}) == {}
    assert core.upstreams["notes"].subscriptions == set()


async def test_ping_and_the_era_method_table(core: Core) -> None:
    assert await core.rpc("ping") == {}
    with pytest.raises(MethodNotFound) as modern_ping:
        await core.rpc("ping", scope=build.client_scope(era="modern"))
    assert modern_ping.value.http_status == 404
    with pytest.raises(MethodNotFound):
        await core.rpc("server/discover")
    discovered = await core.rpc("server/discover", scope=build.client_scope(era="modern"))
    assert discovered["supportedVersions"][0] == "2026-07-28"
    assert discovered["instructions"] == "[notes] Notes are kept forever."
    with pytest.raises(MethodNotFound):
        await core.rpc("tools/delete")


class Emitted:
    """A client channel (``bastion.server.emitter.Emitter``) that keeps what it was sent."""

    def __init__(self) -> None:
        self.notified: list[tuple[str, dict[str, Any]]] = []

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        self.notified.append((method, params))

    async def ask(self, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        raise AssertionError(f"nothing in these tests asks the client ({method})")


async def test_a_listen_request_cancelled_midway_releases_what_it_subscribed(core: Core) -> None:
    """Subscriptions a listen request made upstream before it was cancelled belong to no stream: released at once,
    not left subscribed for good."""
    up = core.upstreams["notes"]
    entered = asyncio.Event()

    async def stuck(params: dict[str, Any], on_message: RelatedMessageHandler | None) -> dict[str, Any]:
        entered.set()
        await asyncio.sleep(3600)
        return {}

    up.script("resources/subscribe", "memo://notes/2", handler=stuck)
    scope = build.client_scope()
    listening = asyncio.create_task(core.dispatcher.listen_resources(
        scope, ["notes+memo://notes/1", "notes+memo://notes/2"], "listen-1"))
    await asyncio.wait_for(entered.wait(), 5)
    assert up.subscriptions == {"memo://notes/1"}
    listening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await listening
    assert up.subscriptions == set()
    assert ("resources/unsubscribe", {"uri": "memo://notes/1"}) in up.requests
