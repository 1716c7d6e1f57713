"""subscriptions/listen filters and streams; result shaping between eras."""

from __future__ import annotations

import pytest

from bastion.errors import InvalidParams
from bastion.server.eras import for_handshake_era, for_modern, undeclared_inputs
from bastion.server.listen import MAX_BUFFERED, SUBSCRIPTION_ID, Listeners, ListenFilter, Stream


def test_filter_honours_only_true_flags_and_lists_uris() -> None:
    f = ListenFilter.from_params({"notifications": {"toolsListChanged": True, "promptsListChanged": False,
                                                    "resourceSubscriptions": ["b://x", "a://y"]}})
    assert f.honoured() == {"toolsListChanged": True, "resourceSubscriptions": ["a://y", "b://x"]}
    assert ListenFilter.from_params({"notifications": {}}).honoured() == {}


@pytest.mark.parametrize("params", [{}, {"notifications": []}, {"notifications": {"resourceSubscriptions": "x"}},
                                    {"notifications": {"resourceSubscriptions": [1]}}])
def test_filter_refuses_malformed_requests(params: dict[str, object]) -> None:
    with pytest.raises(InvalidParams):
        ListenFilter.from_params(params)


async def test_streams_get_only_what_they_opted_into_tagged_with_their_id() -> None:
    registry = Listeners()
    tools = Stream("listen-1", "alice", ListenFilter(lists=frozenset({"tools"})))
    memo = Stream(7, "bob", ListenFilter(resources=frozenset({"memo://a"})))
    registry.open(tools)
    registry.open(memo)
    registry.lists_changed(["prompts", "tools"])
    registry.resource_updated("memo://a", {"uri": "memo://a"})
    registry.resource_updated("memo://b", {"uri": "memo://b"})
    assert tools.queue.get_nowait() == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
                                        "params": {"_meta": {SUBSCRIPTION_ID: "listen-1"}}}
    assert tools.queue.empty()
    assert memo.queue.get_nowait()["params"] == {"uri": "memo://a", "_meta": {SUBSCRIPTION_ID: 7}}
    assert memo.queue.empty()
    assert registry.wanted_resources() == {"memo://a"}
    registry.close(memo)
    assert registry.wanted_resources() == set()


async def test_a_stalled_reader_is_ended_instead_of_buffered_without_bound() -> None:
    stream = Stream(1, "alice", ListenFilter(lists=frozenset({"tools"})))
    registry = Listeners()
    registry.open(stream)
    for _ in range(MAX_BUFFERED + 5):
        registry.lists_changed(["tools"])
    assert stream.queue.get_nowait() is None


def test_legacy_clients_never_see_modern_only_fields() -> None:
    modern = {"tools": [], "resultType": "complete", "ttlMs": 5, "cacheScope": "public",
              "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "up"}}}
    assert for_handshake_era(modern) == {"tools": []}
    kept = for_handshake_era({"content": [], "_meta": {"io.modelcontextprotocol/serverInfo": {}, "x.y/z": 1}})
    assert kept == {"content": [], "_meta": {"x.y/z": 1}}
    plain = {"content": [{"type": "text", "text": "hi"}], "isError": False}
    assert for_handshake_era(plain) is plain  # nothing to drop: no copy
    assert for_handshake_era({"content": [], "ttlMs": 0}) == {"content": []}


def test_modern_clients_get_a_result_type_and_bastions_identity() -> None:
    out = for_modern({"content": [], "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "upstream"}}},
                     {"name": "bastion"})
    assert out["resultType"] == "complete"
    assert out["_meta"]["io.modelcontextprotocol/serverInfo"] == {"name": "bastion"}
    assert for_modern({"resultType": "input_required"}, {})["resultType"] == "input_required"


def test_undeclared_inputs() -> None:
    requests = {"a": {"method": "elicitation/create"}, "b": {"method": "sampling/createMessage"},
                "c": {"method": "evil/thing"}}
    assert undeclared_inputs(requests, {"elicitation": {}}) == ["b", "c"]
    assert undeclared_inputs(None, {}) == []
