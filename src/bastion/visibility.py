"""The tools each caller may see, decided once per catalogue view and policy, and served as pre-encoded pages.

Filtering a 2,000-tool catalogue through a policy costs tens of milliseconds, and encoding it as JSON a few more;
``tools/list`` used to pay both on every page of every listing. What a caller sees depends only on the view (its
tools, quarantine, unavailable upstreams), on the access policy in force, and on what the policy reads of the
caller: its id, groups and the claims its rules name. So the filtered list is kept per such caller, for the
current view and policy only: a new view (a catalogue refresh, an upstream hidden or shown) or a policy reload
empties the cache before anything is served from it, so a caller never sees a tool that left and never misses one
that arrived. Each tool's definition is encoded once per view, as an ``orjson.Fragment`` shared by every caller; a
page is a slice of the caller's fragments, which the response encoder copies straight into the response. Joining
them into one page first would copy a page of 500 tools (650 KB) once more, and twice with the brackets added.

Two callers share an entry only when the policy cannot tell them apart (same id, same groups, same values of the
claims its rules read), so one caller's list is never served to another who may see something else.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import orjson

from bastion import catalogue as cat
from bastion.access import AccessControl
from bastion.principal import Principal
from bastion.tool_entry import ToolEntry
from bastion.view import View

DEFAULT_MAX_CALLERS = 1024


@runtime_checkable
class KeyedAccess(Protocol):
    """Access control that can say what its decisions about a principal depend on."""

    def visibility_key(self, principal: Principal) -> tuple[object, Hashable] | None:
        """``(scope, key)``: ``scope`` is replaced (compared by identity) whenever any decision may change, e.g.
        the policy set in force; principals with equal ``key`` get the same decisions under that scope. None: do
        not cache this principal's list."""


@dataclass(slots=True)
class _Encoded:
    """Each tool definition of one view as JSON, made on first use and shared by every caller's pages."""

    by_name: dict[str, orjson.Fragment] = field(default_factory=dict)

    def of(self, entry: ToolEntry) -> orjson.Fragment:
        encoded = self.by_name.get(entry.public_name)
        if encoded is None:
            encoded = self.by_name[entry.public_name] = orjson.Fragment(orjson.dumps(dict(entry.definition)))
        return encoded


@dataclass(frozen=True, slots=True)
class Listing:
    """The tools one caller sees in one view, in catalogue order (sorted by public name)."""

    tools: tuple[ToolEntry, ...]
    names: tuple[str, ...]
    hidden: int  # tools of the catalogue this caller does not see (policy, quarantine, unavailable upstreams)
    _encoder: _Encoded
    # Each of ``tools`` as JSON, for a listing that is cached: a page is then a tuple slice (references only).
    # None for a listing made for one request, which encodes only the page it serves.
    _encoded: tuple[orjson.Fragment, ...] | None

    def page(self, cursor: Any, size: int) -> tuple[tuple[orjson.Fragment, ...], str | None]:
        """The page after ``cursor`` as a tuple of encoded tools (orjson writes it as a JSON array of them, the
        bytes a list of the definitions would give), and the next cursor."""
        start, end, next_cursor = cat.page(self.names, cursor, size)
        if self._encoded is not None:
            return self._encoded[start:end], next_cursor
        return tuple(map(self._encoder.of, self.tools[start:end])), next_cursor


def _listing(view: View, access: AccessControl, principal: Principal, encoder: _Encoded, *, cached: bool) -> Listing:
    total = view.catalogue.tools
    tools = tuple(t for t in total if t.public_name not in view.quarantined and t.upstream not in view.unavailable
                  and access.tool_visible(principal, t))
    return Listing(tools, tuple(t.public_name for t in tools), len(total) - len(tools), encoder,
                   tuple(map(encoder.of, tools)) if cached else None)


@dataclass(slots=True)
class _Generation:
    """The cache's validity: the objects everything in it was decided from, compared by identity."""

    view: object
    access: object
    scope: object
    encoded: _Encoded
    listings: OrderedDict[Hashable, Listing]


class ToolListings:
    """Listings per caller for the current view and access policy, at most ``max_callers`` of them (LRU)."""

    def __init__(self, max_callers: int = DEFAULT_MAX_CALLERS) -> None:
        self._max = max_callers
        self._generation: _Generation | None = None

    def listing(self, view: View, access: AccessControl, principal: Principal) -> Listing:
        scope, key = _key(access, principal)
        if key is None:
            return _listing(view, access, principal, _Encoded(), cached=False)
        generation = self._generation
        if generation is None or generation.view is not view or generation.access is not access \
                or generation.scope is not scope:
            # Anything decided under another view or policy is dropped before a single answer is served from it.
            generation = self._generation = _Generation(view, access, scope, _Encoded(), OrderedDict())
        listings = generation.listings
        found = listings.get(key)
        if found is not None:
            listings.move_to_end(key)
            return found
        found = listings[key] = _listing(view, access, principal, generation.encoded, cached=True)
        if len(listings) > self._max:
            listings.popitem(last=False)
        return found

    def __len__(self) -> int:
        return len(self._generation.listings) if self._generation is not None else 0


_EVERYONE: tuple[str, ...] = ()


def _key(access: AccessControl, principal: Principal) -> tuple[object, Hashable | None]:
    # What ``isinstance(access, KeyedAccess)`` decides, without the runtime protocol check (typing walks the
    # protocol's members on every call: about a tenth of a page's Python time in a profile of tools/list).
    visibility_key = getattr(access, "visibility_key", None)
    if visibility_key is not None:
        keyed: tuple[object, Hashable] | None = visibility_key(principal)
        return (None, None) if keyed is None else keyed
    if not access.per_principal:
        return None, _EVERYONE  # what a caller sees does not depend on who it is
    return None, None  # an access control that cannot say what it reads: decide every time


def claims_key(attributes: Mapping[str, Any], names: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The values of the claims ``names`` as a hashable key. ``repr`` tells apart what JSON equality might not
    (``1`` and ``1.0``, ``true`` and ``1``, NaN and null): at worst two equal callers get separate entries."""
    return tuple((name, repr(attributes[name]) if name in attributes else "<absent>") for name in names)
