"""subscriptions/listen filters and streams; result shaping between eras."""

from __future__ import annotations

import pytest

from bastion import catalogue as cat
from bastion.access import AllowAll
from bastion.delivery import DeliveryGate, ListChange, list_changes
from bastion.errors import InvalidParams
from bastion.policy.guard import PolicyAccess, PolicyHolder
from bastion.principal import Principal
from bastion.server.eras import for_handshake_era, for_modern, undeclared_inputs
from bastion.server.listen import MAX_BUFFERED, SUBSCRIPTION_ID, Listeners, ListenFilter, Stream
from bastion.view import View
from tests.policy.support import policy

VIEW = View(catalogue=cat.build([cat.UpstreamLists(
    "memo", None, tools=[{"name": "note", "inputSchema": {"type": "object"}}],
    resources=[{"uri": "memo://a", "name": "a"}, {"uri": "memo://b", "name": "b"}])]))
ALICE, BOB = Principal("alice", frozenset({"eng"})), Principal("bob", frozenset({"eng"}))
TOOLS = ListChange("tools", tools=VIEW.catalogue.tools)
PROMPTS = ListChange("prompts", prompts=(("memo", "hello"),))


def open_gate() -> DeliveryGate:
    return DeliveryGate(lambda: VIEW, AllowAll(), ["memo"])


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
    registry = Listeners(open_gate())
    tools = Stream("listen-1", ALICE, ListenFilter(lists=frozenset({"tools"})))
    memo = Stream(7, BOB, ListenFilter(resources=frozenset({"memo://a"})))
    registry.open(tools)
    registry.open(memo)
    registry.lists_changed([PROMPTS, TOOLS])
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
    stream = Stream(1, ALICE, ListenFilter(lists=frozenset({"tools"})))
    registry = Listeners(open_gate())
    registry.open(stream)
    for _ in range(MAX_BUFFERED + 5):
        registry.lists_changed([TOOLS])
    assert stream.queue.get_nowait() is None


async def test_a_principal_past_its_bound_ends_its_own_oldest_stream_never_anyone_elses() -> None:
    registry = Listeners(open_gate(), max_per_principal=2)
    alice = [Stream(i, ALICE, ListenFilter(lists=frozenset({"tools"}))) for i in range(3)]
    bob = Stream("b", BOB, ListenFilter(lists=frozenset({"tools"})))
    assert registry.open(alice[0]) == [] and registry.open(bob) == [] and registry.open(alice[1]) == []
    registry.lists_changed([TOOLS])  # waiting in alice's oldest stream when it is ended: dropped
    assert registry.open(alice[2]) == [alice[0]]
    assert alice[0].queue.get_nowait() is None and alice[0].queue.empty()
    assert registry.all() == [bob, alice[1], alice[2]]
    assert bob.queue.qsize() == 1 and alice[1].queue.qsize() == 1


async def test_each_message_is_authorised_under_the_policy_in_force_when_it_is_delivered() -> None:
    """A stream keeps what it opted into, not a right to it: after a reload that hides a resource or a list's
    entries, their updates stop; a reload that shows them again brings them back."""
    open_policy = policy("""
        version: 1
        rules:
          - {id: eng, effect: allow, principals: {groups: [eng]}}
    """)
    closed = policy("""
        version: 1
        rules:
          - {id: eng, effect: allow, principals: {groups: [eng]}, resources: ["memo://b"]}
          - {id: no-a, effect: deny, resources: ["memo://a"]}
    """)
    holder = PolicyHolder(open_policy)
    registry = Listeners(DeliveryGate(lambda: VIEW, PolicyAccess(holder), ["memo"]))
    stream = Stream("s", ALICE, ListenFilter(lists=frozenset({"tools"}), resources=frozenset({"memo://a"})))
    registry.open(stream)

    def delivered() -> list[str]:
        out = []
        while not stream.queue.empty():
            item = stream.queue.get_nowait()
            assert item is not None
            out.append(item["method"])
        return out

    registry.resource_updated("memo://a", {"uri": "memo://a"})
    registry.lists_changed([TOOLS])
    assert delivered() == ["notifications/resources/updated", "notifications/tools/list_changed"]
    holder.swap(closed)  # no tools, and memo://a denied
    registry.resource_updated("memo://a", {"uri": "memo://a"})
    registry.lists_changed([TOOLS])
    assert delivered() == []
    holder.swap(open_policy)
    registry.resource_updated("memo://a", {"uri": "memo://a"})
    assert delivered() == ["notifications/resources/updated"]


def test_a_list_change_names_only_the_entries_that_changed() -> None:
    grown = View(catalogue=cat.build([cat.UpstreamLists(
        "memo", None, tools=[{"name": "note", "inputSchema": {"type": "object"}},
                             {"name": "more", "inputSchema": {"type": "object"}}],
        resources=[{"uri": "memo://a", "name": "a"}, {"uri": "memo://b", "name": "b (renamed)"}])]))
    tools, resources = list_changes(VIEW, grown, ["tools", "resources"])
    assert [t.public_name for t in tools.tools] == ["more"]
    assert resources.resources == (("memo", "memo://b"),)
    # A principal who may see none of the changed entries is not told the list changed.
    only_a = policy("""
        version: 1
        rules:
          - {id: a, effect: allow, resources: ["memo://a"]}
    """)
    gate = DeliveryGate(lambda: grown, PolicyAccess(PolicyHolder(only_a)), ["memo"])
    assert not gate.allows(ALICE, tools) and not gate.allows(ALICE, resources)
    assert gate.allows(ALICE, list_changes(VIEW, View(), ["resources"])[0])  # memo://a left: that is news to her
    assert not gate.allows(None, tools)


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
