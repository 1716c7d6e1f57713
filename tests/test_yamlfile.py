"""The one strict YAML loader that reads the config file and policy files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.yamlfile import load_yaml_file, load_yaml_text


@pytest.mark.parametrize("aliases", [False, True])
@pytest.mark.parametrize(("text", "line", "path", "fragment"), [
    ("a: 1\nb:\n  c: 1\n  c: 2\n", 4, "b.c", "duplicate key 'c' (first at line 3)"),
    ("a:\n  1: x\n", 2, "a", "keys must be plain strings"),
    ("a:\n  yes: x\n", 2, "a", "keys must be plain strings"),
    ("base: {x: 1}\na:\n  <<: {y: 2}\n", 3, "a.<<", "merge keys ('<<') are not supported"),
    ("a: !!set {x, y}\n", 1, "a", "unsupported YAML tag"),
    ("a:\n  - !!omap [{x: 1}]\n", 2, "a[0]", "unsupported YAML tag"),
    ("a:\n  b: 2001-13-45\n", 2, "a.b", "invalid YAML value: month must be in 1..12"),
    ("a: !!python/object:os.system x\n", 1, "a", "invalid YAML value"),
    ("a: [1\n", 2, None, "invalid YAML"),
])
def test_refused_everywhere_with_file_line_and_key(text: str, line: int, path: str | None, fragment: str,
                                                   aliases: bool) -> None:
    with pytest.raises(ConfigError) as info:
        load_yaml_text(text, "f.yaml", aliases=aliases)
    err = info.value
    assert (err.source, err.line, err.path) == ("f.yaml", line, path)
    assert fragment in err.message


def test_anchors_and_aliases_only_where_allowed() -> None:
    text = "base: &b {x: 1}\nlist:\n  - *b\n"
    assert load_yaml_text(text, "c.yaml", aliases=True).data == {"base": {"x": 1}, "list": [{"x": 1}]}
    with pytest.raises(ConfigError, match="anchors and aliases are not supported") as info:
        load_yaml_text(text, "p.yaml")
    assert (info.value.line, info.value.path) == (1, "list[0]")


def test_every_key_path_has_its_line_and_deeper_paths_the_nearest() -> None:
    doc = load_yaml_text("rules:\n  - id: a\n    tools:\n      - x\n      - y\n", "p.yaml")
    assert doc.data == {"rules": [{"id": "a", "tools": ["x", "y"]}]}
    assert doc.line_of("rules[0].tools[1]") == 5
    assert doc.line_of("rules[0].id") == 2
    assert doc.line_of("rules[0].unknown.deeper") == 2
    assert doc.line_of(None) is None
    assert load_yaml_text("", "empty.yaml").data is None


def test_an_error_about_a_yaml_boolean_word_names_the_word_and_the_fix() -> None:
    doc = load_yaml_text("validation:\n  output: off\n  other: false\n", "c.yaml")
    assert doc.data == {"validation": {"output": False, "other": False}}
    err = doc.error("must be one of strict, warn, off", "validation.output")
    assert err.line == 2
    assert 'unquoted word off as the boolean false: quote it, output: "off"' in err.message
    assert "YAML 1.1" not in doc.error("must be a string", "validation.other").message


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read file") as info:
        load_yaml_file(tmp_path / "absent.yaml")
    assert info.value.source == str(tmp_path / "absent.yaml")


def test_yaml_nested_too_deeply_is_a_config_error() -> None:
    # The composer recurses per level: without this, a RecursionError escaped every loader (and stopped the
    # policy watcher for good).
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_yaml_text("rules: " + "[" * 20000 + "]" * 20000 + "\n", "p.yaml")
