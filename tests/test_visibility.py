"""Per-caller tool listings: cached per view and policy, never stale, never shared between callers the policy tells
apart, and encoded to exactly the bytes the uncached path produced."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from bastion import catalogue as cat
from bastion.access import AllowAll
from bastion.policy.decide import PolicySet
from bastion.policy.guard import PolicyAccess, PolicyHolder
from bastion.principal import Principal
from bastion.view import View
from bastion.visibility import ToolListings
from tests.policy.support import policy, who
from tests.support.catalogue_corpus import upstream_lists

POLICY = """
    version: 1
    rules:
      - id: engineers-even
        effect: allow
        principals: {groups: [engineering]}
        tools: ["u00__*", "u02__*"]
      - id: tenant-acme
        effect: allow
        principals: {claims: {tenant: acme}}
        tools: ["u01__*"]
      - id: bob-everything
        effect: allow
        principals: {ids: [bob]}
        tools: ["*"]
"""


def view(upstreams: int = 3, tools: int = 20, **changes: object) -> View:
    built = View(catalogue=cat.build(list(upstream_lists(upstreams, tools).values())))
    return dataclasses.replace(built, **changes)  # type: ignore[arg-type]


def uncached(v: View, access: PolicyAccess | AllowAll, principal: Principal) -> list[str]:
    """What the gateway computed per request before the cache: the reference the cache must equal."""
    return [t.public_name for t in v.catalogue.tools if t.public_name not in v.quarantined
            and t.upstream not in v.unavailable and access.tool_visible(principal, t)]


def all_pages(listings: ToolListings, v: View, access: PolicyAccess | AllowAll, principal: Principal,
              size: int = 7) -> list[bytes]:
    listing = listings.listing(v, access, principal)
    pages, cursor = [], None
    while True:
        fragment, cursor = listing.page(cursor, size)
        pages.append(orjson.dumps({"tools": fragment}))
        if cursor is None:
            return pages


def access_with(text: str = POLICY) -> tuple[PolicyHolder, PolicyAccess]:
    holder = PolicyHolder(policy(text))
    return holder, PolicyAccess(holder)


@pytest.mark.parametrize("principal", [who("erin", "engineering"), who("carol", tenant="acme"), who("bob"),
                                       who("dave", tenant="other"), who("erin", "engineering", tenant="acme")])
def test_pages_are_the_bytes_the_uncached_path_wrote(principal: Principal) -> None:
    _, access = access_with()
    v = view()
    expected = uncached(v, access, principal)
    listings = ToolListings()
    for _ in range(2):  # computed, then served from the cache
        pages = all_pages(listings, v, access, principal)
        names = [t.public_name for t in listings.listing(v, access, principal).tools]
        assert names == expected
        by_name = {t.public_name: t for t in v.catalogue.tools}
        old = [orjson.dumps({"tools": [dict(by_name[n].definition) for n in expected[i:i + 7]]})
               for i in range(0, max(len(expected), 1), 7)]
        assert pages == old


def test_callers_the_policy_tells_apart_never_share_a_list() -> None:
    _, access = access_with()
    v = view()
    listings = ToolListings()
    callers = [who("erin", "engineering"), who("bob"), who("carol", tenant="acme"), who("carol", tenant="other"),
               who("carol", "engineering"), who("anyone")]
    seen = [[t.public_name for t in listings.listing(v, access, p).tools] for p in callers]
    # Each answer is that caller's own, whatever order they were cached in.
    for principal, names in zip(callers, seen, strict=True):
        assert names == uncached(v, access, principal), principal
        assert [t.public_name for t in listings.listing(v, access, principal).tools] == names
    assert seen[2] != seen[3]
    assert seen[5] == []


def test_callers_the_policy_cannot_tell_apart_share_one_entry() -> None:
    _, access = access_with()
    v = view()
    listings = ToolListings()
    a = listings.listing(v, access, who("erin", "engineering", tenant="acme", iat=1))
    b = listings.listing(v, access, who("erin", "engineering", tenant="acme", iat=2))  # a claim no rule reads
    assert a is b
    assert len(listings) == 1


def test_a_new_view_is_never_answered_from_the_old_one() -> None:
    _, access = access_with()
    bob = who("bob")
    listings = ToolListings()
    old = view(tools=20)
    assert len(listings.listing(old, access, bob).tools) == 60
    grown = view(tools=21)  # a refresh: one more tool per upstream
    assert len(listings.listing(grown, access, bob).tools) == 63
    quarantined = dataclasses.replace(grown, quarantined={"u01__get_pipeline_1": "schema rejected"})
    names = [t.public_name for t in listings.listing(quarantined, access, bob).tools]
    assert "u01__get_pipeline_1" not in names and len(names) == 62
    down = dataclasses.replace(quarantined, unavailable=frozenset({"up02"}))
    assert {t.upstream for t in listings.listing(down, access, bob).tools} == {"up00", "up01"}
    assert [t.public_name for t in listings.listing(down, access, bob).tools] == uncached(down, access, bob)


def test_a_policy_reload_is_seen_at_once() -> None:
    holder, access = access_with()
    v = view()
    erin = who("erin", "engineering")
    listings = ToolListings()
    before = [t.public_name for t in listings.listing(v, access, erin).tools]
    assert {n[:3] for n in before} == {"u00", "u02"}
    holder.swap(policy("""
        version: 1
        rules:
          - {id: engineers-u01, effect: allow, principals: {groups: [engineering]}, tools: ["u01__*"]}
    """))
    after = [t.public_name for t in listings.listing(v, access, erin).tools]
    assert {n[:3] for n in after} == {"u01"}
    assert after == uncached(v, access, erin)
    holder.swap(PolicySet())  # nothing allowed
    assert listings.listing(v, access, erin).tools == ()


def test_without_a_policy_everyone_shares_one_listing() -> None:
    v = view()
    listings = ToolListings()
    access = AllowAll()
    a = listings.listing(v, access, who("a"))
    assert listings.listing(v, access, who("b", "x", tenant="t")) is a
    assert len(a.tools) == len(v.catalogue.tools) and a.hidden == 0


def test_the_cache_is_bounded() -> None:
    _, access = access_with()
    v = view()
    listings = ToolListings(max_callers=3)
    for i in range(10):
        listings.listing(v, access, who(f"user{i}", "engineering"))
    assert len(listings) == 3
    # The most recently used survive; an evicted caller is simply decided again, correctly.
    first = listings.listing(v, access, who("user0", "engineering"))
    assert [t.public_name for t in first.tools] == uncached(v, access, who("user0", "engineering"))


def test_hidden_counts_what_the_caller_does_not_see() -> None:
    _, access = access_with()
    v = dataclasses.replace(view(), quarantined={"u00__search_issue_0": "pin changed"})
    listing = ToolListings().listing(v, access, who("erin", "engineering"))
    assert listing.hidden == len(v.catalogue.tools) - len(listing.tools)
    assert "u00__search_issue_0" not in {t.public_name for t in listing.tools}
