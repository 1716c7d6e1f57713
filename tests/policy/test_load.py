"""Loader errors: every one names file, line and key path, and nothing invalid is ever half-loaded."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.policy.load import load_policies
from tests.policy.support import policy

HEAD = "version: 1\nrules:\n"


def load_error(body: str, source: str = "policies/dev.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        policy(body, source)
    return info.value


@pytest.mark.parametrize(("body", "line", "path", "needle"), [
    (HEAD + "  - id: a\n    effect: allow\n    toolz: [x]\n", 5, "rules[0].toolz", "unknown key 'toolz'"),
    (HEAD + "  - id: a\n    effect: allow\n    principals: {group: [x]}\n", 5, "rules[0].principals.group",
     "unknown key 'group'"),
    (HEAD + "  - id: a\n    effect: allow\n    arguments:\n      path: {prefix: /x}\n", 6,
     "rules[0].arguments.path.prefix", "unknown key 'prefix'"),
    ("version: 1\nrulez: []\n", 2, "rulez", "unknown key 'rulez'"),
    # A limit counting none of the requests for what its rule governs would never apply: refused, not ignored.
    (HEAD + "  - id: a\n    effect: allow\n    prompts: ['*']\n    limits:\n"
            "      - {name: x, rate: 1/hour, methods: [tools/call]}\n", 7, "rules[0].limits[0].methods",
     "governs prompts, whose requests are completion/complete, prompts/get; a limit counting only tools/call"),
    (HEAD + "  - id: a\n    effect: allow\n    tools: ['*']\n    concurrency:\n"
            "      - {name: c, max: 1, methods: [resources/read, prompts/get]}\n", 7,
     "rules[0].concurrency[0].methods", "governs tools, whose requests are tools/call"),
    (HEAD + "  - id: a\n    effect: allow\n    effect: deny\n", 5, "rules[0].effect", "duplicate key 'effect'"),
    (HEAD + "  - id: a\n    effect: alow\n", 4, "rules[0].effect", "'alow' is not one of"),
    (HEAD + "  - effect: allow\n", 3, "rules[0]", "missing required key: 'id'"),
    ("version: 2\n", 1, "version", "unsupported policy version 2"),
    (HEAD + "  - id: a\n    effect: allow\n    tools: [files__read_file, 'files__re\u0430d']\n", 5,
     "rules[0].tools[1]", "U+0430"),
    (HEAD + "  - id: a\n    effect: allow\n    tools: ['files__[ab]']\n", 5, "rules[0].tools[0]", "invalid glob"),
    (HEAD + "  - id: a\n    effect: allow\n    tools: ['files__read\\*']\n", 5, "rules[0].tools[0]",
     "invalid glob"),
    (HEAD + "  - id: a\n    effect: allow\n    annotations: {readOnlyHint: true}\n", 5, "rules[0].annotations",
     "allow rule cannot match on annotations"),
    (HEAD + "  - id: a\n    effect: allow\n    mode: shadow\n", 5, "rules[0].mode", "shadow mode is for deny"),
    (HEAD + "  - id: a\n    effect: deny\n    limits: [{name: l, rate: 1/s}]\n", 5, "rules[0].limits",
     "attach to allow rules"),
    (HEAD + "  - id: a\n    effect: allow\n    limits: [{name: l, rate: lots}]\n", 5, "rules[0].limits[0].rate",
     "invalid rate 'lots'"),
    (HEAD + "  - id: a\n    effect: allow\n    arguments: {q: {pattern: '(a'}}\n", 5,
     "rules[0].arguments.q.pattern", "invalid pattern"),
    (HEAD + "  - id: a\n    effect: allow\n    arguments: {q: {pattern: '(a)\\1'}}\n", 5,
     "rules[0].arguments.q.pattern", "RE2"),
    (HEAD + "  - id: a\n    effect: allow\n    arguments: {p: {path_prefix: /srv/../etc}}\n", 5,
     "rules[0].arguments.p.path_prefix", "invalid path_prefix"),
    (HEAD + "  - id: a\n    effect: allow\n    arguments: {p: {path_prefix: srv}}\n", 5,
     "rules[0].arguments.p.path_prefix", "absolute"),
    (HEAD + "  - id: a\n    effect: allow\n    arguments: {n: {min: 5, max: 1}}\n", 5, "rules[0].arguments.n",
     "greater than max"),
    (HEAD + "  - id: a\n    effect: allow\n    prompts: [x]\n    arguments: {n: {max: 1}}\n", 3, "rules[0]",
     "apply to tools only"),
    (HEAD + "  - id: a\n    effect: allow\n    upstreams: ['gith\u0443b']\n", 5, "rules[0].upstreams[0]",
     "invalid upstream name"),
    (HEAD + "  - id: a\n    effect: allow\n  - id: a\n    effect: deny\n", 5, "rules[1].id",
     "duplicate rule id 'a' (first defined at policies/dev.yaml:3)"),
    (HEAD + "  - id: a\n    effect: allow\n    limits: [{name: l, rate: 1/s}]\n  - id: b\n    effect: allow\n"
     "    limits: [{name: l, rate: 2/s}]\n", 8, "rules[1].limits[0].name", "already defined differently"),
    (HEAD + "  - &r {id: a, effect: allow}\n  - *r\n", 3, "rules[1]", "aliases are not supported"),
    ("version: 1\n<<: {rules: []}\n", 2, "<<", "merge keys"),
    (HEAD + "  - id: a\n    effect: allow\n    yes: 1\n", 5, "rules[0]", "keys must be plain strings"),
    (HEAD + "  - id: 'bad id'\n    effect: allow\n", 3, "rules[0].id", "invalid rule id"),
    (HEAD + "  - id: a\n    effect: allow\n    tools: []\n", 5, "rules[0].tools", "should be non-empty"),
    (HEAD + "  - id: a\n    effect: allow\n    principals: {claims: {role: {nested: x}}}\n", 5,
     "rules[0].principals.claims.role", "a claim value must be"),
])
def test_errors_name_file_line_and_path(body: str, line: int, path: str, needle: str) -> None:
    err = load_error(body)
    assert (err.source, err.line, err.path) == ("policies/dev.yaml", line, path), str(err)
    assert needle in err.message
    assert str(err).startswith(f"policies/dev.yaml:{line} [{path}]: ")


def test_yaml_syntax_error_names_line() -> None:
    err = load_error("version: 1\nrules:\n  - id: [a\n")
    assert err.source == "policies/dev.yaml"
    assert err.line is not None
    assert "invalid YAML" in err.message


def test_several_schema_errors_report_the_first_by_line_and_count_the_rest() -> None:
    err = load_error(HEAD + "  - id: a\n    effect: allow\n    toolz: [x]\n  - id: b\n    effect: nope\n")
    assert err.line == 5
    assert "1 more problem" in err.message


def test_non_mapping_document() -> None:
    assert "must be a mapping" in load_error("- a\n- b\n").message


def test_rule_ids_unique_across_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("version: 1\nrules:\n  - id: shared\n    effect: allow\n")
    (tmp_path / "b.yml").write_text("version: 1\nrules:\n  - {id: other, effect: deny}\n"
                                    "  - {id: shared, effect: deny}\n")
    with pytest.raises(ConfigError) as info:
        load_policies([tmp_path])
    assert str(info.value) == (f"{tmp_path}/b.yml:4 [rules[1].id]: duplicate rule id 'shared' "
                               f"(first defined at {tmp_path}/a.yaml:3)")


def test_directory_loads_yaml_files_sorted_and_skips_hidden_and_other_files(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("version: 1\nrules: [{id: b, effect: allow}]\n")
    (tmp_path / "a.yml").write_text("version: 1\nrules: [{id: a, effect: allow}]\n")
    (tmp_path / ".b.yaml.swp").write_text("garbage: [")
    (tmp_path / "README.md").write_text("# not a policy")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text("garbage: [")
    loaded = load_policies([tmp_path])
    assert [r.id for r in loaded.rules] == ["a", "b"]
    assert loaded.files == (str(tmp_path / "a.yml"), str(tmp_path / "b.yaml"))


def test_missing_path_and_empty_directory_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such policy file"):
        load_policies([tmp_path / "nope"])
    with pytest.raises(ConfigError, match="no policy files"):
        load_policies([tmp_path])


def test_invalid_utf8_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_bytes(b"version: 1\n# \xff\n")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_policies([tmp_path / "x.yaml"])


def test_rule_origin_records_file_and_line() -> None:
    loaded = policy(textwrap.dedent("""\
        version: 1
        rules:
          - id: first
            effect: allow
          - id: second
            effect: deny
        """), "p.yaml")
    assert [r.origin for r in loaded.rules] == ["p.yaml:3", "p.yaml:5"]
