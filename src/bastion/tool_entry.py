"""A tool as bastion knows it: the upstream's definition plus where it came from and what the client calls it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """One tool of the merged catalogue.

    ``definition`` is the tool object as clients see it (already renamed to ``public_name`` and sanitized);
    ``upstream_definition`` is what the upstream sent, kept for fingerprinting and schema compilation.
    """

    public_name: str
    upstream: str
    original_name: str
    definition: Mapping[str, Any]
    upstream_definition: Mapping[str, Any]

    @property
    def annotations(self) -> Mapping[str, Any]:
        ann = self.upstream_definition.get("annotations")
        return ann if isinstance(ann, Mapping) else {}

    @property
    def input_schema(self) -> Mapping[str, Any] | None:
        schema = self.upstream_definition.get("inputSchema")
        return schema if isinstance(schema, Mapping) else None

    @property
    def output_schema(self) -> Mapping[str, Any] | None:
        schema = self.upstream_definition.get("outputSchema")
        return schema if isinstance(schema, Mapping) else None
