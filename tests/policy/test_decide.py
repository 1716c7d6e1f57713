"""The decision function over a wide table: precedence, globs, case, look-alikes, arguments, shadow, limits."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.errors import ConfigError
from bastion.ratelimit.model import Rate
from tests.policy.support import policy, tool, who

POLICY = policy("""
    version: 1
    rules:
      - id: eng-files
        effect: allow
        principals: {groups: [engineering]}
        tools: ["files__*"]
        limits: [{name: eng-files, rate: 60/minute, burst: 10, per: principal}]
        concurrency: [{name: eng-inflight, max: 2}]
      - id: eng-read-limited
        effect: allow
        principals: {groups: [engineering]}
        tools: [files__read_file]
        limits: [{name: eng-read, rate: 10/second}]
      - id: no-delete
        effect: deny
        tools: ["files__delete_*"]
      - id: alice-search
        effect: allow
        principals: {ids: [alice]}
        tools: ["search__q?ery"]
      - id: no-secrets
        effect: deny
        tools: [files__read_file]
        arguments: {path: {path_prefix: /srv/secrets}}
      - id: proj-write
        effect: allow
        principals: {ids: [bob]}
        tools: [files__write_file]
        arguments:
          path: {path_prefix: /srv/projects}
          mode: {enum: [append, overwrite], optional: true}
          size: {type: integer, min: 1, max: 100, optional: true}
          note: {pattern: "[a-z ]{0,20}", max_length: 20, optional: true}
      - id: gh-readers
        effect: allow
        principals: {claims: {role: [reader, admin], tenant: acme}}
        upstreams: [github]
      - id: no-destructive-gh
        effect: deny
        upstreams: [github]
        annotations: {destructiveHint: true}
      - id: shadow-no-write
        effect: deny
        mode: shadow
        tools: ["*__write_*"]
    costs:
      - {tools: ["files__*"], weight: 2}
      - {tools: ["files__write_file"], weight: 7}
""")

RO = {"readOnlyHint": True}
ENG = who("erin", "engineering")


@pytest.mark.parametrize(("principal", "name", "upstream", "annotations", "args", "allowed", "rule"), [
    # group allow via glob; exact rule order does not matter for deny
    (ENG, "files__list", None, None, {}, True, "eng-files"),
    (ENG, "files__delete_file", None, None, {}, False, "no-delete"),
    (who("mallory", "sales"), "files__list", None, None, {}, False, None),
    # case-sensitive names
    (ENG, "Files__list", None, None, {}, False, None),
    (ENG, "FILES__LIST", None, None, {}, False, None),
    # '?' matches exactly one character
    (who("alice"), "search__query", None, None, {}, True, "alice-search"),
    (who("alice"), "search__qXery", None, None, {}, True, "alice-search"),
    (who("alice"), "search__qery", None, None, {}, False, None),
    (who("alice"), "search__quuery", None, None, {}, False, None),
    # '.' in a glob is literal, '*' does not need a separator
    (ENG, "files__", None, None, {}, True, "eng-files"),
    # Unicode look-alikes never match: Cyrillic a, fullwidth letters, zero-width space, trailing newline
    (ENG, "files__re\u0430d_file", None, None, {}, False, None),
    (ENG, "\uff46iles__read_file", None, None, {}, False, None),
    (ENG, "files__read\u200b_file", None, None, {}, False, None),
    (ENG, "files__read_file\n", None, None, {}, False, None),
    # deny wins over allow, even with argument constraints
    (ENG, "files__read_file", None, None, {"path": "/srv/secrets/key"}, False, "no-secrets"),
    (ENG, "files__read_file", None, None, {"path": "/srv/public/../secrets/key"}, False, "no-secrets"),
    (ENG, "files__read_file", None, None, {"path": "/srv/secrets-old/x"}, True, "eng-files"),
    # a value the deny cannot judge is refused: NUL, backslash, climbing '..', relative path, wrong type
    (ENG, "files__read_file", None, None, {"path": "/srv/secrets\x00/x"}, False, "no-secrets"),
    (ENG, "files__read_file", None, None, {"path": "/srv\\secrets\\key"}, False, "no-secrets"),
    (ENG, "files__read_file", None, None, {"path": "/../srv/secrets/key"}, False, "no-secrets"),
    (ENG, "files__read_file", None, None, {"path": "srv/secrets/key"}, False, "no-secrets"),
    (ENG, "files__read_file", None, None, {"path": 42}, False, "no-secrets"),
    (ENG, "files__read_file", None, None, {}, True, "eng-files"),
    # allow with argument constraints: satisfied
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a.txt"}, True, "proj-write"),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/./a/../b.txt", "mode": "append",
                                                   "size": 100, "note": "hello world"}, True, "proj-write"),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects"}, True, "proj-write"),
    # ... and violated: traversal, sibling prefix, missing required, enum, range, bool-is-not-int, pattern, length
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/../etc/passwd"}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects-evil/a"}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "//srv//projects/../../etc"}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a\x00.txt"}, False, None),
    (who("bob"), "files__write_file", None, None, {"mode": "append"}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a", "mode": "truncate"}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a", "size": 101}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a", "size": 0}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a", "size": 1.5}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a", "size": True}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a", "note": "Hello"}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a", "note": "a" * 21}, False, None),
    (who("bob"), "files__write_file", None, None, {"path": "/srv/projects/a", "note": 5}, False, None),
    # claims: all listed claims must match; list claims match by any element
    (who("carol", role="reader", tenant="acme"), "gh__get", "github", RO, {}, True, "gh-readers"),
    (who("carol", role=["dev", "admin"], tenant="acme"), "gh__get", "github", RO, {}, True, "gh-readers"),
    (who("carol", role="reader", tenant="other"), "gh__get", "github", RO, {}, False, None),
    (who("carol", role="reader"), "gh__get", "github", RO, {}, False, None),
    (who("carol", role="writer", tenant="acme"), "gh__get", "github", RO, {}, False, None),
    # upstream matching uses the tool's upstream, not its name
    (who("carol", role="reader", tenant="acme"), "github__get", "other", RO, {}, False, None),
    # annotations tighten: explicit destructive, silent (spec default destructive), malformed hint
    (who("carol", role="reader", tenant="acme"), "gh__drop", "github", {"destructiveHint": True}, {}, False,
     "no-destructive-gh"),
    (who("carol", role="reader", tenant="acme"), "gh__drop", "github", {}, {}, False, "no-destructive-gh"),
    (who("carol", role="reader", tenant="acme"), "gh__drop", "github", {"destructiveHint": "no"}, {}, False,
     "no-destructive-gh"),
    (who("carol", role="reader", tenant="acme"), "gh__safe", "github", {"destructiveHint": False}, {}, True,
     "gh-readers"),
])
def test_decision_table(principal: Any, name: str, upstream: str | None, annotations: Any, args: Any,
                        allowed: bool, rule: str | None) -> None:
    decision = POLICY.decide(principal, tool(name, upstream, annotations), args)
    assert (decision.allowed, decision.rule_id) == (allowed, rule), decision.reason


def test_allowed_decision_collects_limits_of_all_matching_allow_rules_and_cost() -> None:
    decision = POLICY.decide(ENG, tool("files__read_file"), {"path": "/srv/a"})
    assert decision.allowed
    assert [s.name for s in decision.limits] == ["eng-files", "eng-read"]
    assert decision.limits[0].rate == Rate(60, 60.0)
    assert decision.limits[0].effective_burst == 10
    assert decision.limits[1].scope == "principal"
    assert [(c.name, c.max, c.scope) for c in decision.concurrency] == [("eng-inflight", 2, "principal")]
    assert decision.cost == 2
    assert POLICY.decide(who("bob"), tool("files__write_file"), {"path": "/srv/projects/x"}).cost == 7


def test_denied_decision_carries_no_limits() -> None:
    decision = POLICY.decide(ENG, tool("files__delete_x"), {})
    assert not decision.allowed
    assert (decision.limits, decision.concurrency) == ((), ())
    assert "no-delete" in decision.reason


def test_shadow_rule_reports_but_does_not_enforce() -> None:
    decision = POLICY.decide(who("bob"), tool("files__write_file"), {"path": "/srv/projects/x"})
    assert decision.allowed
    assert decision.shadow_denies == ("shadow-no-write",)
    denied = POLICY.decide(who("mallory"), tool("files__write_file"), {})
    assert not denied.allowed
    assert denied.shadow_denies == ("shadow-no-write",)
    assert POLICY.decide(ENG, tool("files__list"), {}).shadow_denies == ()


@pytest.mark.parametrize(("principal", "name", "visible"), [
    (who("bob"), "files__write_file", True),      # allow with argument constraints: some call may pass
    (ENG, "files__read_file", True),              # deny with argument constraints does not hide
    (ENG, "files__delete_file", False),           # deny without argument constraints hides
    (who("mallory"), "files__read_file", False),  # default deny hides
    (ENG, "files__re\u0430d_file", False),
])
def test_listing_agrees_with_calls(principal: Any, name: str, visible: bool) -> None:
    assert POLICY.visible(principal, tool(name)) is visible


def test_a_tool_hidden_from_the_list_can_never_be_called() -> None:
    samples: list[dict[str, Any]] = [{}, {"path": "/srv/projects/a"}, {"path": "/srv/secrets/a"}, {"path": 1}]
    for principal in (ENG, who("bob"), who("alice"), who("mallory")):
        for name in ("files__read_file", "files__write_file", "files__delete_x", "search__query"):
            if not POLICY.visible(principal, tool(name)):
                assert not any(POLICY.decide(principal, tool(name), a).allowed for a in samples)


def test_empty_policy_denies_everything() -> None:
    empty = policy("version: 1\n")
    decision = empty.decide(ENG, tool("files__list"), {})
    assert (decision.allowed, decision.rule_id) == (False, None)
    assert "default deny" in decision.reason


PR = policy(r"""
    version: 1
    rules:
      - id: docs-all
        effect: allow
        upstreams: [docs]
      - id: eng-prompts
        effect: allow
        principals: {groups: [engineering]}
        prompts: ["code__review*"]
      - id: eng-resources
        effect: allow
        principals: {groups: [engineering]}
        resources: ["file:///srv/projects/*", 'mem://notes/a\?b', 'mem://star/\*']
      - id: no-private-resources
        effect: deny
        resources: ["file:///srv/projects/private/*"]
      - id: tools-only
        effect: allow
        principals: {groups: [engineering]}
        tools: ["*"]
""")


@pytest.mark.parametrize(("upstream", "name", "allowed", "rule"), [
    ("code", "code__review", True, "eng-prompts"),
    ("code", "code__review_pr", True, "eng-prompts"),
    ("code", "code__summarize", False, None),
    ("docs", "docs__anything", True, "docs-all"),
    ("code", "code__rev\u0456ew", False, None),
])
def test_prompts(upstream: str, name: str, allowed: bool, rule: str | None) -> None:
    decision = PR.decide_prompt(ENG, upstream, name)
    assert (decision.allowed, decision.rule_id) == (allowed, rule)


@pytest.mark.parametrize(("uri", "allowed", "rule"), [
    ("file:///srv/projects/readme.md", True, "eng-resources"),
    ("file:///srv/projects/a/b/c.txt", True, "eng-resources"),
    ("file:///srv/projects/private/key", False, "no-private-resources"),
    ("file:///srv/projects/../etc/passwd", False, None),
    ("file:///srv/projects/%2e%2e/etc/passwd", False, None),
    ("file:///srv/projects/..%2fetc/passwd", False, None),
    ("file:///srv/projects/%252e%252e/etc", False, None),
    ("file:///srv/projects/a\\..\\..\\etc", False, None),
    ("file:///srv/projects/\u0430", False, None),
    ("file:///srv/other", False, None),
    ("mem://notes/a?b", True, "eng-resources"),       # escaped '?' is literal
    ("mem://notes/aXb", False, None),
    ("mem://star/*", True, "eng-resources"),          # escaped '*' is literal
    ("mem://star/anything", False, None),
])
def test_resources(uri: str, allowed: bool, rule: str | None) -> None:
    decision = PR.decide_resource(ENG, "files", uri)
    assert (decision.allowed, decision.rule_id) == (allowed, rule), decision.reason


def test_rule_with_only_tools_does_not_cover_prompts_or_resources() -> None:
    assert PR.decide(ENG, tool("code__anything"), {}).rule_id == "tools-only"
    assert not PR.decide_prompt(ENG, "code", "code__anything").allowed
    assert not PR.decide_resource(ENG, "code", "mem://x").allowed


def test_rule_without_target_matchers_covers_all_kinds() -> None:
    p = who("visitor")
    assert PR.decide(p, tool("docs__search"), {}).rule_id == "docs-all"
    assert PR.decide_prompt(p, "docs", "docs__intro").rule_id == "docs-all"
    assert PR.decide_resource(p, "docs", "docs://index").rule_id == "docs-all"


def test_read_only_tool_that_says_nothing_about_destruction_is_not_destructive() -> None:
    carol = who("carol", role="reader", tenant="acme")
    assert POLICY.decide(carol, tool("gh__get", "github", {"readOnlyHint": True}), {}).allowed
    assert not POLICY.decide(carol, tool("gh__get", "github", {"readOnlyHint": False}), {}).allowed


def test_version_is_a_content_hash() -> None:
    text = "version: 1\nrules: [{id: a, effect: allow}]\n"
    assert policy(text).version == policy(text).version
    assert policy(text).version != policy(text.replace("allow", "deny")).version


CANON = policy(r"""
    version: 1
    rules:
      - id: all
        effect: allow
      - id: no-secrets
        effect: deny
        resources: ["files+FILE://localhost/srv/%73ecret/*"]
""")


@pytest.mark.parametrize("uri", [
    "files+file:///srv/secret/key.pem", "files+FILE:///srv/secret/key.pem", "FILES+file:///srv/secret/key.pem",
    "files+file:///srv/%73ecret/key.pem", "files+file:///srv//secret/key.pem", "files+file:////srv/secret/key.pem",
    "files+file://localhost/srv/secret/key.pem", "files+file:/srv/secret/key.pem",
    "files+file:///srv/public/../secret/key.pem", "files+file:///srv/%2E%2E/srv/secret/./key.pem",
])
def test_every_spelling_of_a_uri_meets_the_rule_written_in_any_spelling(uri: str) -> None:
    decision = CANON.decide_resource(ENG, "files", uri)
    assert (decision.allowed, decision.rule_id) == (False, "no-secrets"), uri


@pytest.mark.parametrize(("uri", "why"), [
    ("files+file:///srv/secret%2Fkey.pem", "encoded '/'"), ("files+file:///srv/%25s", "encoded '%'"),
    ("files+file:///srv/a\\b", "backslash"), ("files+file:///srv/%zz", "'%' not followed"),
])
def test_a_uri_without_a_canonical_form_is_never_allowed(uri: str, why: str) -> None:
    decision = CANON.decide_resource(ENG, "files", uri)
    assert not decision.allowed and why in decision.reason


def test_globs_that_could_never_match_a_canonical_uri_are_load_errors() -> None:
    for glob in ["file:///srv/../etc/*", "file:///srv/%2e/x", "file:///a%2Fb/*"]:
        with pytest.raises(ConfigError, match="could never match"):
            policy(f"""
                version: 1
                rules:
                  - {{id: r, effect: deny, resources: ["{glob}"]}}
            """)


METHODS = policy("""
    version: 1
    rules:
      - id: docs
        effect: allow
        upstreams: [docs]
        limits:
          - {name: every, rate: 10/minute}
          - {name: calls, rate: 5/minute, methods: [tools/call]}
          - {name: reads, rate: 2/minute, per: principal_tool, methods: [resources/read, prompts/get]}
        concurrency:
          - {name: reading, max: 1, methods: [resources/read]}
""")


def test_a_tool_call_decision_carries_only_the_limits_that_count_tools_call() -> None:
    decision = METHODS.decide(ENG, tool("docs__search", "docs"), {})
    assert [s.name for s in decision.limits] == ["every", "calls"]
    assert decision.concurrency == ()


def test_a_prompt_or_resource_decision_carries_every_limit_for_the_request_to_choose() -> None:
    decision = METHODS.decide_resource(ENG, "docs", "docs://index")
    assert [s.name for s in decision.limits] == ["every", "calls", "reads"]
    assert decision.limits[2].methods == frozenset({"resources/read", "prompts/get"})
    assert [c.name for c in decision.concurrency] == ["reading"]


def test_a_rule_limit_naming_a_method_bastion_does_not_forward_is_refused_at_load() -> None:
    with pytest.raises(ConfigError) as info:
        policy("""
            version: 1
            rules:
              - id: r
                effect: allow
                limits: [{name: x, rate: 1/s, methods: [tools/list]}]
        """)
    assert "tools/list" in info.value.message
