"""The pure catalogue: merging, naming, collisions, cursors, resource URI routing."""

from __future__ import annotations

from types import SimpleNamespace as Up

import pytest

from bastion import catalogue as cat
from bastion.errors import InvalidParams


def tool(name: str, **extra: object) -> dict[str, object]:
    return {"name": name, "inputSchema": {"type": "object"}, **extra}


def test_tools_are_namespaced_sorted_and_keep_their_upstream_definition() -> None:
    merged = cat.build([cat.UpstreamLists("files", "files", tools=[tool("read"), tool("write")]),
                        cat.UpstreamLists("git", "gh", tools=[tool("log")])])
    assert [t.public_name for t in merged.tools] == ["files__read", "files__write", "gh__log"]
    entry = merged.tool("gh__log")
    assert entry is not None
    assert (entry.upstream, entry.original_name) == ("git", "log")
    assert entry.definition["name"] == "gh__log"
    assert entry.upstream_definition["name"] == "log"


def test_no_prefix_publishes_the_upstream_names() -> None:
    merged = cat.build([cat.UpstreamLists("conf", None, tools=[tool("test_simple_text")])])
    assert merged.tool("test_simple_text") is not None


@pytest.mark.parametrize("rule", ["first", "reject"])
def test_collisions_follow_the_declared_rule_and_are_never_silent(rule: str) -> None:
    lists = [cat.UpstreamLists("a", None, tools=[tool("search")]),
             cat.UpstreamLists("b", None, tools=[tool("search"), tool("other")])]
    merged = cat.build(lists, on_collision=rule)  # type: ignore[arg-type]
    search = merged.tool("search")
    if rule == "first":
        assert search is not None
        assert search.upstream == "a"
        assert [d.upstream for d in merged.dropped] == ["b"]
    else:
        assert search is None
        assert sorted(d.upstream for d in merged.dropped) == ["a", "b"]
    assert merged.tool("other") is not None
    assert all("collides" in d.reason or "claimed" in d.reason for d in merged.dropped)


def test_names_outside_the_spec_alphabet_or_length_are_dropped() -> None:
    merged = cat.build([cat.UpstreamLists("x", "x", tools=[tool("has space"), tool("ok"), tool("é"),
                                                             tool("a" * 126), tool("")])])
    assert [t.public_name for t in merged.tools] == ["x__ok"]
    assert len(merged.dropped) == 4


def test_a_tool_listed_twice_by_one_upstream_is_dropped_once() -> None:
    merged = cat.build([cat.UpstreamLists("x", "x", tools=[tool("a"), tool("a", description="again")])])
    assert len(merged.tools) == 1
    assert merged.dropped[0].reason == "upstream listed the same tool twice"


def test_version_changes_with_definitions_only() -> None:
    one = cat.build([cat.UpstreamLists("x", "x", tools=[tool("a")])])
    same = cat.build([cat.UpstreamLists("x", "x", tools=[tool("a")])])
    other = cat.build([cat.UpstreamLists("x", "x", tools=[tool("a", description="changed")])])
    assert one.version == same.version != other.version


def test_keyset_cursors_page_through_everything_once() -> None:
    names = [f"t{i:03d}" for i in range(10)]
    seen, cursor = [], None
    while True:
        start, end, cursor = cat.page(names, cursor, 3)
        seen.extend(names[start:end])
        if cursor is None:
            break
    assert seen == names


def test_a_cursor_survives_a_refresh_that_inserts_names_before_it() -> None:
    _, _, cursor = cat.page(["b", "d", "f"], None, 2)
    start, end, _ = cat.page(["a", "b", "c", "d", "e", "f"], cursor, 10)
    assert ["a", "b", "c", "d", "e", "f"][start:end] == ["e", "f"]


@pytest.mark.parametrize("bad", ["", "nope", "b1.!!!", 42, "b1.\u00e9"])
def test_bad_cursors_are_invalid_params(bad: object) -> None:
    with pytest.raises(InvalidParams):
        cat.page(["a"], bad, 10)


def test_resource_uris_are_prefixed_reversibly_and_routed() -> None:
    merged = cat.build([
        cat.UpstreamLists("files", "files", resources=[{"uri": "file:///a.txt", "name": "a"}],
                          templates=[{"uriTemplate": "file:///{path}", "name": "any"}]),
        cat.UpstreamLists("docs", None, resources=[{"uri": "memo://readme", "name": "r"}],
                          templates=[{"uriTemplate": "memo://notes/{id}", "name": "n"}]),
        cat.UpstreamLists("wiki", None, resources=[{"uri": "wiki://home", "name": "h"}]),
    ])
    assert ("files", {"uri": "files+file:///a.txt", "name": "a"}) in merged.resources
    assert cat.route_uri(merged, "files+file:///b/c.txt", ["docs", "wiki"]) == ("files", "file:///b/c.txt")
    assert cat.route_uri(merged, "memo://readme", ["docs", "wiki"]) == ("docs", "memo://readme")
    assert cat.route_uri(merged, "memo://notes/7", ["docs", "wiki"]) == ("docs", "memo://notes/7")
    assert cat.route_uri(merged, "wiki://home", ["docs", "wiki"]) == ("wiki", "wiki://home")
    assert cat.route_uri(merged, "unknown://x", ["docs", "wiki"]) is None
    assert cat.route_uri(merged, "unknown://x", ["docs"]) == ("docs", "unknown://x")


def test_prompts_are_namespaced_like_tools() -> None:
    merged = cat.build([cat.UpstreamLists("a", "a", prompts=[{"name": "greet"}]),
                        cat.UpstreamLists("b", "b", prompts=[{"name": "greet"}])])
    assert [p.public_name for p in merged.prompts] == ["a__greet", "b__greet"]
    prompt = merged.prompt("b__greet")
    assert prompt is not None
    assert prompt.original_name == "greet"


def test_naming_reads_the_configured_prefixes_and_separator_backwards() -> None:
    naming = cat.Naming.of([Up(name="github", prefix="gh"), Up(name="files", prefix="files"),
                        Up(name="local", prefix=None)], ".")
    assert naming.upstreams_of_name("gh.create_issue") == ("github",)
    assert naming.upstreams_of_name("files.read") == ("files",)
    assert naming.upstreams_of_name("gh.") == ("local",)  # no tool name after the prefix: not github's
    assert naming.upstreams_of_name("github__x") == ("local",)  # no configured prefix: the unprefixed upstream's
    assert naming.upstreams_of_uri("gh+https://api/x") == ("github",)
    assert naming.upstreams_of_uri("memo://x") == ("local",)
    # Two unprefixed upstreams: the config alone cannot tell which (the live catalogue's listings can).
    two = cat.Naming.of([Up(name="a", prefix=None), Up(name="b", prefix="")], "__")
    assert two.upstreams_of_name("x") == ("a", "b")
    # Without a config: the default naming, each upstream's prefix being its name.
    assert cat.Naming().upstreams_of_name("files__read") == ("files",)
    assert cat.Naming().upstreams_of_name("read") == ()
    assert cat.Naming().upstreams_of_uri("files+file:///a") == ("files",)
    assert cat.Naming().upstreams_of_uri("file:///a+b") == ()
