"""Bounds on what one upstream may put into the catalogue, applied while its lists are fetched.

An upstream decides how many tools it lists, how large each definition is and how many pages it serves; left
unbounded, one hostile or broken upstream can make every refresh cost seconds of CPU and hundreds of megabytes,
for every client of the gateway. ``ListBudget`` applies the ``catalogue.limits`` to one list fetch page by page:
items beyond a bound are dropped (never truncated: half a definition is a different definition), fetching stops
once nothing more could be kept, and ``drops()`` says what was dropped and why, once per (list, limit). The
upstream's cursors count against ``max_list_size`` with the definitions: it chooses their length, each is sent back
and kept until the listing ends (to tell a repeated one), so 100 pages with a 10 MB cursor each cost the gateway a
gigabyte while keeping nothing.

Measuring is bounded too (``json_size`` stops at the bound), and the walk hands the event loop back every few
milliseconds, so building a catalogue from a 50,000-tool or 30 MB listing never stalls other clients' calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bastion.errors import ConfigError
from bastion.units import parse_size
from bastion.validation.limits import KIB, MIB, Excess, json_size

ListKind = Literal["tools", "prompts", "resources", "templates"]
# The config key of the bound that dropped an item; audit records and logs name it so an admin knows what to raise.
LimitName = Literal["max_tools", "max_prompts", "max_resources", "max_definition_size", "max_schema_size",
                    "max_list_size", "max_pages"]

_NAME_KEY: Mapping[ListKind, str] = {"tools": "name", "prompts": "name", "resources": "uri",
                                     "templates": "uriTemplate"}
_COUNT_LIMIT: Mapping[ListKind, LimitName] = {"tools": "max_tools", "prompts": "max_prompts",
                                              "resources": "max_resources", "templates": "max_resources"}
_SCHEMA_KEYS = ("inputSchema", "outputSchema")
_SAMPLE = 10
_SLICE_S = 0.005


@dataclass(frozen=True, slots=True)
class CatalogueLimits:
    """``catalogue.limits``: per upstream and list; sizes are approximate JSON bytes."""

    max_tools: int = 1000
    max_prompts: int = 1000
    max_resources: int = 10_000  # resources and resource templates, each
    max_definition_bytes: int = 512 * KIB
    max_schema_bytes: int = 256 * KIB
    max_list_bytes: int = 16 * MIB
    max_pages: int = 100
    # Nesting bound for measuring a definition; deeper than any real schema, shallow enough for an iterative walk.
    max_depth: int = 64

    @classmethod
    def from_mapping(cls, data: Any, path: str = "catalogue.limits") -> CatalogueLimits:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", path=path)
        counts = {"max_tools": "max_tools", "max_prompts": "max_prompts", "max_resources": "max_resources",
                  "max_pages": "max_pages"}
        sizes = {"max_definition_size": "max_definition_bytes", "max_schema_size": "max_schema_bytes",
                 "max_list_size": "max_list_bytes"}
        values: dict[str, int] = {}
        for key, value in data.items():
            where = f"{path}.{key}"
            if key in counts:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ConfigError("expected an integer >= 1", path=where)
                values[counts[key]] = value
            elif key in sizes:
                values[sizes[key]] = parse_size(value, where)
            else:
                raise ConfigError(f"unknown key {key!r} (allowed: {', '.join(sorted(counts | sizes))})",
                                  path=where)
        return cls(**values)

    def bound(self, limit: LimitName) -> int:
        return {"max_tools": self.max_tools, "max_prompts": self.max_prompts, "max_resources": self.max_resources,
                "max_definition_size": self.max_definition_bytes, "max_schema_size": self.max_schema_bytes,
                "max_list_size": self.max_list_bytes, "max_pages": self.max_pages}[limit]


@dataclass(frozen=True, slots=True)
class LimitDrop:
    """Items of one upstream list dropped by one bound (``dropped`` 0 and no names: the listing was cut short, by
    ``max_pages`` or by a cursor that did not fit in ``max_list_size``)."""

    upstream: str
    list: ListKind
    limit: LimitName
    bound: int
    dropped: int
    names: tuple[str, ...]


class ListBudget:
    """Apply the limits to one list fetch. ``await add_page(page)`` returns False once fetching should stop."""

    def __init__(self, upstream: str, kind: ListKind, limits: CatalogueLimits) -> None:
        self.upstream = upstream
        self.kind = kind
        self.limits = limits
        self.items: list[Mapping[str, Any]] = []
        self._bytes = 0
        self._full: LimitName | None = None
        self._dropped: dict[LimitName, int] = {}
        self._names: dict[LimitName, list[str]] = {}
        self._pages = 0
        # Bounds that cut the listing short (no item dropped, fetching stopped): ``max_pages``, ``max_list_size``.
        self._cuts: list[LimitName] = []

    async def add_page(self, page: Sequence[Any]) -> bool:
        self._pages += 1
        deadline = time.perf_counter() + _SLICE_S
        for item in page:
            if not isinstance(item, Mapping):
                continue
            why = self._admit(item)
            if why is not None:
                self._drop(why, item)
            if time.perf_counter() >= deadline:
                # Hand the loop back: other clients' calls run between slices of a huge page.
                await asyncio.sleep(0)
                deadline = time.perf_counter() + _SLICE_S
        return self._full is None

    def more_pages_refused(self) -> None:
        """The upstream offered another page, but ``max_pages`` were fetched already."""
        self._cuts.append("max_pages")

    def admit_cursor(self, cursor: str) -> bool:
        """Whether the page after ``cursor`` may be fetched: the cursor fits in ``max_list_size`` with what was
        kept (and earlier cursors). One that does not cuts the listing short."""
        if self._full is not None:
            return False
        if self._bytes + len(cursor) > self.limits.max_list_bytes:
            self._cuts.append("max_list_size")
            return False
        self._bytes += len(cursor)
        return True

    @property
    def pages_left(self) -> bool:
        return self._pages < self.limits.max_pages

    def _admit(self, item: Mapping[str, Any]) -> LimitName | None:
        if self._full is not None:
            return self._full
        count_limit = _COUNT_LIMIT[self.kind]
        if len(self.items) >= self.limits.bound(count_limit):
            self._full = count_limit
            return count_limit
        size = json_size(item, max_bytes=self.limits.max_definition_bytes, max_depth=self.limits.max_depth)
        if isinstance(size, Excess):
            return "max_definition_size"
        if self.kind == "tools":
            for key in _SCHEMA_KEYS:
                schema = item.get(key)
                if schema is not None and isinstance(json_size(schema, max_bytes=self.limits.max_schema_bytes,
                                                               max_depth=self.limits.max_depth), Excess):
                    return "max_schema_size"
        if self._bytes + size > self.limits.max_list_bytes:
            self._full = "max_list_size"
            return "max_list_size"
        self._bytes += size
        self.items.append(item)
        return None

    def _drop(self, why: LimitName, item: Mapping[str, Any]) -> None:
        self._dropped[why] = self._dropped.get(why, 0) + 1
        names = self._names.setdefault(why, [])
        if len(names) < _SAMPLE:
            name = item.get(_NAME_KEY[self.kind])
            names.append(name[:128] if isinstance(name, str) else "?")

    def drops(self) -> list[LimitDrop]:
        out = [LimitDrop(self.upstream, self.kind, why, self.limits.bound(why), count, tuple(self._names[why]))
               for why, count in self._dropped.items()]
        out.extend(LimitDrop(self.upstream, self.kind, why, self.limits.bound(why), 0, ()) for why in self._cuts)
        return out
