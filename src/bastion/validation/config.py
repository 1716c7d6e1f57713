"""The ``validation`` section of the gateway configuration.

```yaml
validation:
  output: strict            # strict | warn | off (default strict)
  limits: {max_schema_bytes: 262144, max_argument_depth: 64}
  upstreams:
    files:
      output: warn
      tools: {read_file: off}
```
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast, get_args

from bastion.errors import ConfigError
from bastion.tool_entry import ToolEntry
from bastion.validation.guards import OutputMode
from bastion.validation.limits import SchemaLimits

_MODES = get_args(OutputMode)
# Depth bounds protect the Python stack: jsonschema recurses a few frames per level of the value.
_MAX_DEPTH_CAP = 128
_DEPTH_KEYS = frozenset({"max_schema_depth", "max_argument_depth", "max_output_depth"})


@dataclass(frozen=True, slots=True)
class UpstreamValidation:
    output: OutputMode | None = None
    tools: Mapping[str, OutputMode] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class ValidationConfig:
    output: OutputMode = "strict"
    limits: SchemaLimits = field(default_factory=SchemaLimits)
    upstreams: Mapping[str, UpstreamValidation] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], path: str = "validation") -> ValidationConfig:
        _mapping(data, path)
        _only(data, {"output", "limits", "upstreams"}, path)
        output = _mode(data.get("output", "strict"), f"{path}.output")
        limits = _limits(data.get("limits", {}), f"{path}.limits")
        upstreams_raw = _mapping(data.get("upstreams", {}), f"{path}.upstreams")
        upstreams = {str(name): _upstream(value, f"{path}.upstreams.{name}") for name, value in upstreams_raw.items()}
        return cls(output=output, limits=limits, upstreams=MappingProxyType(upstreams))

    def mode_for(self, upstream: str, original_tool_name: str) -> OutputMode:
        """The output mode for one tool: its own setting, else its upstream's, else the global one."""
        entry = self.upstreams.get(upstream)
        if entry is None:
            return self.output
        return entry.tools.get(original_tool_name, entry.output or self.output)

    def mode_for_tool(self, tool: ToolEntry) -> OutputMode:
        """``mode_for`` keyed by a catalogue entry: the shape ``OutputSchemaGuard`` takes."""
        return self.mode_for(tool.upstream, tool.original_name)


def _upstream(data: Any, path: str) -> UpstreamValidation:
    _mapping(data, path)
    _only(data, {"output", "tools"}, path)
    output = _mode(data["output"], f"{path}.output") if "output" in data else None
    tools_raw = _mapping(data.get("tools", {}), f"{path}.tools")
    tools = {str(name): _mode(mode, f"{path}.tools.{name}") for name, mode in tools_raw.items()}
    return UpstreamValidation(output=output, tools=MappingProxyType(tools))


def _limits(data: Any, path: str) -> SchemaLimits:
    _mapping(data, path)
    known = {f.name for f in dataclasses.fields(SchemaLimits)}
    _only(data, known, path)
    values: dict[str, int] = {}
    for key, value in data.items():
        # bool is an int in Python; `true` is never a sensible limit.
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError("must be a positive integer", path=f"{path}.{key}")
        if key in _DEPTH_KEYS and value > _MAX_DEPTH_CAP:
            raise ConfigError(f"must be at most {_MAX_DEPTH_CAP}", path=f"{path}.{key}")
        values[key] = value
    return SchemaLimits(**values)


def _mode(value: Any, path: str) -> OutputMode:
    if value not in _MODES:
        raise ConfigError(f"must be one of {', '.join(_MODES)}", path=path)
    return cast(OutputMode, value)


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError("must be a mapping", path=path)
    return value


def _only(data: Mapping[str, Any], allowed: set[str] | frozenset[str], path: str) -> None:
    for key in data:
        if key not in allowed:
            raise ConfigError(f"unknown key (allowed: {', '.join(sorted(allowed))})", path=f"{path}.{key}")
