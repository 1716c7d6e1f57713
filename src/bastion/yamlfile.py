"""Strict YAML for the files admins edit (the config file, policy files, policy test cases).

``yaml.safe_load`` alone silently keeps the last of two duplicate keys, which in a security config or a policy
means half of what the admin wrote is dropped without a word. So a document is composed with the safe loader and
walked once: duplicate keys, keys that are not plain strings and tagged collections are refused, every key path's
line is recorded (errors say ``bastion.yaml:14 [upstreams.files.url]``), and unquoted YAML 1.1 boolean words
(``off``, ``yes``) are remembered so an error about such a value can name the word and the fix. Policy files also
refuse anchors and aliases (``aliases=False``): an alias can multiply a small file into a huge one, and a rule
should read on its own. Merge keys (``<<``) are refused everywhere.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bastion.errors import ConfigError

__all__ = ["YamlDoc", "expand_env", "join_path", "load_yaml_file", "load_yaml_text", "parent_path"]

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TRUE_WORDS = frozenset({"yes", "y", "on"})


@dataclass(frozen=True, slots=True)
class YamlDoc:
    """A parsed document and the 1-based line of each key path (``rules[2].tools[0]``)."""

    data: Any
    source: str
    lines: Mapping[str, int] = field(default_factory=dict)
    # Paths whose value was an unquoted YAML 1.1 boolean word other than true/false (``off``, ``yes``, ...) ->
    # the word as written. YAML reads ``output: off`` as ``False``; an error there names the word and the fix.
    bool_words: Mapping[str, str] = field(default_factory=dict)

    def line_of(self, path: str | None) -> int | None:
        """The line of ``path``, or of its nearest enclosing key we know."""
        probe = path or ""
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            probe = parent_path(probe)
        return None

    def error(self, message: str, path: str | None) -> ConfigError:
        """A ConfigError for ``path``, pointing at the nearest line we know."""
        word = self.bool_words.get(path) if path else None
        if word is not None and path:
            key = path.rsplit(".", 1)[-1]
            message = (f"{message} (YAML 1.1 reads the unquoted word {word} as the boolean "
                       f"{str(word.lower() in _TRUE_WORDS).lower()}: quote it, {key}: \"{word}\")")
        return ConfigError(message, source=self.source, path=path or None, line=self.line_of(path))


def parent_path(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def load_yaml_text(text: str, source: str, *, aliases: bool = False) -> YamlDoc:
    """Parse ``text`` strictly (see the module's docstring); ``aliases`` allows anchors and aliases."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is None:
            return YamlDoc(None, source)
        walk = _Walk(source, aliases)
        data = walk.node(root, "")
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {_problem(exc)}", source=source, line=_line(exc)) from None
    except RecursionError:
        # The composer and the walk recurse per level: thousands of nested brackets exhaust the stack.
        raise ConfigError("invalid YAML: nested too deeply", source=source) from None
    return YamlDoc(data, source, walk.lines, walk.words)


def load_yaml_file(path: Path, *, aliases: bool = False) -> YamlDoc:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", source=str(path)) from None
    return load_yaml_text(text, str(path), aliases=aliases)


class _Walk:
    """One pass over the composed node tree: checks, records lines and boolean words, builds the value."""

    def __init__(self, source: str, aliases: bool) -> None:
        self.source = source
        self.aliases = aliases
        self.lines: dict[str, int] = {}
        self.words: dict[str, str] = {}
        self._seen: set[int] = set()

    def node(self, node: yaml.Node, path: str) -> Any:
        if not self.aliases:
            if id(node) in self._seen:
                # The alias shares the anchored node, so the line is the anchor's; the path is the alias's.
                raise self._error("YAML anchors and aliases are not supported in policy files; write the value out",
                                  path, node)
            self._seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ_TAG:
                raise self._error(f"unsupported YAML tag {node.tag!r} on a list", path, node)
            items = []
            for i, item in enumerate(node.value):
                child = join_path(path, i)
                self.lines[child] = item.start_mark.line + 1
                items.append(self.node(item, child))
            return items
        assert isinstance(node, yaml.ScalarNode)
        value = self._scalar(node, path)
        if isinstance(value, bool) and node.style is None and node.value.lower() not in ("true", "false"):
            self.words[path] = node.value
        return value

    def _mapping(self, node: yaml.MappingNode, path: str) -> dict[str, Any]:
        if node.tag != _MAP_TAG:
            raise self._error(f"unsupported YAML tag {node.tag!r} on a mapping", path, node)
        out: dict[str, Any] = {}
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag == _MERGE_TAG:
                where = "" if self.aliases else " in policy files"
                raise ConfigError(f"YAML merge keys ('<<') are not supported{where}", source=self.source,
                                  path=join_path(path, "<<"), line=line)
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                raise ConfigError("keys must be plain strings (quote keys like 'yes', '1' or 'null')",
                                  source=self.source, path=path or None, line=line)
            key = key_node.value
            child = join_path(path, key)
            if key in first:
                raise ConfigError(f"duplicate key {key!r} (first at line {first[key]})", source=self.source,
                                  path=child, line=line)
            first[key] = line
            self.lines[child] = line
            out[key] = self.node(value_node, child)
        return out

    def _scalar(self, node: yaml.ScalarNode, path: str) -> Any:
        loader = yaml.SafeLoader("")
        try:
            return loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError) as exc:
            # A value the safe constructor refuses (an unknown tag) or cannot build (a date like 2001-13-45).
            problem = _problem(exc) if isinstance(exc, yaml.YAMLError) else str(exc)
            raise ConfigError(f"invalid YAML value: {problem}", source=self.source, path=path or None,
                              line=node.start_mark.line + 1) from None
        finally:
            loader.dispose()

    def _error(self, message: str, path: str, node: yaml.Node) -> ConfigError:
        return ConfigError(message, source=self.source, path=path or None, line=node.start_mark.line + 1)


def _problem(exc: yaml.YAMLError) -> str:
    return str(getattr(exc, "problem", None) or exc)


def _line(exc: yaml.YAMLError) -> int | None:
    mark = getattr(exc, "problem_mark", None)
    return mark.line + 1 if mark is not None else None


def expand_env(value: str, path: str, env: Mapping[str, str] | None = None) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}``. A missing variable without a default is an error, not ''."""
    environ = os.environ if env is None else env

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(f"environment variable {name} is not set", path=path)

    return _ENV_REF.sub(sub, value)
