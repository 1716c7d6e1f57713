"""Strict YAML for policy files: safe types only, every key path traceable to its line.

``yaml.safe_load`` keeps the last of two duplicate keys without a word; in a policy that silently drops half of a
rule. So the document is composed with the safe loader, walked once to refuse duplicate keys, non-string keys,
merge keys and aliases (an alias can multiply a small file into a huge one, and a rule should read on its own),
and only then constructed by the same safe loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from bastion.errors import ConfigError

_STR_TAG = "tag:yaml.org,2002:str"


@dataclass(frozen=True, slots=True)
class YamlSource:
    """A parsed document and the 1-based line of each key path (``rules[2].tools[0]``)."""

    data: Any
    source: str
    lines: Mapping[str, int]

    def line_of(self, path: str | None) -> int | None:
        """The line of ``path``, or of its nearest enclosing key we know."""
        probe = path or ""
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            probe = parent_path(probe)
        return None

    def error(self, message: str, path: str | None) -> ConfigError:
        return ConfigError(message, source=self.source, path=path or None, line=self.line_of(path))


def parent_path(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def parse_yaml(text: str, source: str) -> YamlSource:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML: {problem}", source=source,
                          line=mark.line + 1 if mark is not None else None) from None
    if root is None:
        return YamlSource(None, source, {})
    lines: dict[str, int] = {}
    _walk(root, "", lines, source, set())
    loader = yaml.SafeLoader("")
    try:
        data = loader.construct_document(root)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"invalid YAML value: {getattr(exc, 'problem', exc)}", source=source,
                          line=mark.line + 1 if mark is not None else None) from None
    finally:
        loader.dispose()
    return YamlSource(data, source, lines)


def _walk(node: yaml.Node, path: str, lines: dict[str, int], source: str, seen: set[int]) -> None:
    if id(node) in seen:
        # The alias shares the anchored node, so the line is the anchor's; the path is the alias's.
        raise ConfigError("YAML anchors and aliases are not supported in policy files; write the value out",
                          source=source, path=path or None, line=node.start_mark.line + 1)
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == "<<":
                raise ConfigError("YAML merge keys ('<<') are not supported in policy files", source=source,
                                  path=join_path(path, "<<"), line=line)
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                raise ConfigError("keys must be plain strings (quote keys like 'yes', '1' or 'null')",
                                  source=source, path=path or None, line=line)
            key = key_node.value
            child = join_path(path, key)
            if key in keys:
                raise ConfigError(f"duplicate key {key!r} (first at line {keys[key]})", source=source, path=child,
                                  line=line)
            keys[key] = line
            lines[child] = line
            _walk(value_node, child, lines, source, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            child = join_path(path, i)
            lines[child] = item.start_mark.line + 1
            _walk(item, child, lines, source, seen)
