"""Safe YAML loading for files admins edit: duplicate keys rejected, every value traceable to its line.

``yaml.safe_load`` alone silently keeps the last of two duplicate keys, which in a security config means the
admin's intent is dropped without a word. This loader composes the node tree with the safe loader, refuses
duplicates, and records the line of every key path so errors can say ``bastion.yaml:14 [upstreams.files.url]``.
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

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True, slots=True)
class YamlDoc:
    data: Any
    source: str
    lines: Mapping[str, int] = field(default_factory=dict)
    # Paths whose value was an unquoted YAML 1.1 boolean word other than true/false (``off``, ``yes``, ...) ->
    # the word as written. YAML reads ``output: off`` as ``False``; an error there names the word and the fix.
    bool_words: Mapping[str, str] = field(default_factory=dict)

    def error(self, message: str, path: str) -> ConfigError:
        """A ConfigError for ``path``, pointing at the nearest line we know."""
        probe = path
        while probe and probe not in self.lines:
            probe = probe.rsplit(".", 1)[0] if "." in probe else ""
        word = self.bool_words.get(path)
        if word is not None:
            message = (f"{message} (YAML 1.1 reads the unquoted word {word} as the boolean "
                       f"{str(word.lower() in _TRUE_WORDS).lower()}: quote it, {path.rsplit('.', 1)[-1]}: "
                       f"\"{word}\")")
        return ConfigError(message, source=self.source, path=path, line=self.lines.get(probe))


_TRUE_WORDS = frozenset({"yes", "y", "on"})


def _walk(node: yaml.Node, path: str, lines: dict[str, int], source: str,
          words: dict[str, str] | None = None) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node)) if not isinstance(key_node, yaml.ScalarNode) \
                else _scalar(key_node)
            if not isinstance(key, str):
                key = str(key)
            child = f"{path}.{key}" if path else key
            if key in out:
                raise ConfigError(f"duplicate key {key!r}", source=source, path=child,
                                  line=key_node.start_mark.line + 1)
            lines[child] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, child, lines, source, words)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            child = f"{path}[{i}]"
            lines[child] = item.start_mark.line + 1
            items.append(_walk(item, child, lines, source, words))
        return items
    assert isinstance(node, yaml.ScalarNode)
    value = _scalar(node)
    if words is not None and isinstance(value, bool) and node.style is None \
            and node.value.lower() not in ("true", "false"):
        words[path] = node.value
    return value


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def load_yaml_text(text: str, source: str) -> YamlDoc:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML: {problem}", source=source, line=line) from None
    lines: dict[str, int] = {}
    words: dict[str, str] = {}
    data = _walk(root, "", lines, source, words) if root is not None else None
    return YamlDoc(data=data, source=source, lines=lines, bool_words=words)


def load_yaml_file(path: Path) -> YamlDoc:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", source=str(path)) from None
    return load_yaml_text(text, str(path))


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
