"""Who may receive a message bastion pushes outside any request's own answer, decided when it is delivered.

Pushed messages (resource updates, ``notifications/*/list_changed``, upstream log messages) reach a client long
after it asked for them: a legacy session's ``resources/subscribe`` or ``logging/setLevel`` and its GET stream, a
2026-07-28 ``subscriptions/listen`` stream. What it may see can change in between (a policy reload, a catalogue
refresh), so nothing decided at subscribe time is trusted at delivery: every push names what it tells about (its
``Topic``) and ``DeliveryGate.allows`` decides, for the receiving principal, against the policy and the catalogue
view in force at that instant, by the same access decisions that answer ``resources/read`` and the lists. Every
push path asks here: ``bastion.broadcast`` (resource updates and log messages on GET streams), ``server.listen``
(listen streams), ``server.lifecycle`` (list changes on GET streams).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bastion import catalogue as cat
from bastion.access import AccessControl, may_see_upstream
from bastion.principal import Principal
from bastion.tool_entry import ToolEntry
from bastion.view import View

__all__ = ["DeliveryGate", "ListChange", "ResourceTopic", "Topic", "UpstreamTopic", "list_changes"]


@dataclass(frozen=True, slots=True)
class ResourceTopic:
    """An update of one resource, by its canonical public URI: for whoever may read it now."""

    uri: str


@dataclass(frozen=True, slots=True)
class UpstreamTopic:
    """A message from an upstream outside any call (a log message): for whoever may see something of it now."""

    upstream: str


@dataclass(frozen=True, slots=True)
class ListChange:
    """A list changed: for whoever may see one of the entries that changed (in the old view or the new one)."""

    kind: str  # tools | prompts | resources
    tools: tuple[ToolEntry, ...] = ()
    prompts: tuple[tuple[str, str], ...] = ()  # (upstream, public name)
    resources: tuple[tuple[str, str], ...] = ()  # (upstream, public URI or URI template)


Topic = ResourceTopic | UpstreamTopic | ListChange


class DeliveryGate:
    """Decides each push against the view and the access policy in force when it is delivered."""

    def __init__(self, view: Callable[[], View], access: AccessControl, unprefixed: Sequence[str]) -> None:
        self._view = view
        self._access = access
        self._unprefixed = tuple(unprefixed)

    def allows(self, principal: Principal | None, topic: Topic) -> bool:
        """May ``principal`` be told about ``topic`` now? No principal (nobody authenticated holds the stream):
        no."""
        if principal is None:
            return False
        access = self._access
        if isinstance(topic, ResourceTopic):
            # What resources/read of this URI would decide now: routed in the current catalogue, and visible.
            routed = cat.route_uri(self._view().catalogue, topic.uri, self._unprefixed)
            return routed is not None and access.resource_visible(principal, routed[0], topic.uri)
        if isinstance(topic, UpstreamTopic):
            return may_see_upstream(self._view(), access, principal, topic.upstream)
        return any(access.tool_visible(principal, t) for t in topic.tools) \
            or any(access.prompt_visible(principal, up, name) for up, name in topic.prompts) \
            or any(access.resource_visible(principal, up, uri) for up, uri in topic.resources)


def list_changes(old: View, new: View, kinds: Sequence[str]) -> list[ListChange]:
    """The entries of each changed list that differ between two views: added, removed, rewritten, and tools that
    were hidden or shown (quarantine, an unavailable upstream). A receiver is told of a list change only if one
    of these is visible to it."""
    out = []
    for kind in kinds:
        if kind == "tools":
            before = {t.public_name: t for t in _shown_tools(old)}
            after = {t.public_name: t for t in _shown_tools(new)}
            changed = [t for name, t in before.items() if after.get(name) is None
                       or after[name].definition != t.definition] + \
                      [t for name, t in after.items() if before.get(name) is None
                       or before[name].definition != t.definition]
            out.append(ListChange(kind, tools=tuple(changed)))
        elif kind == "prompts":
            pb = {(p.upstream, p.public_name): p.definition for p in old.catalogue.prompts}
            pa = {(p.upstream, p.public_name): p.definition for p in new.catalogue.prompts}
            out.append(ListChange(kind, prompts=tuple(k for k in pb.keys() | pa.keys() if pb.get(k) != pa.get(k))))
        elif kind == "resources":
            rb = _resource_entries(old)
            ra = _resource_entries(new)
            out.append(ListChange(kind, resources=tuple(k for k in rb.keys() | ra.keys() if rb.get(k) != ra.get(k))))
    return out


def _shown_tools(view: View) -> list[ToolEntry]:
    return [t for t in view.catalogue.tools if t.public_name not in view.quarantined
            and t.upstream not in view.unavailable]


def _resource_entries(view: View) -> dict[tuple[str, str], object]:
    entries: dict[tuple[str, str], object] = {}
    for up, res in view.catalogue.resources:
        entries[(up, str(res.get("uri")))] = res
    for up, tpl in view.catalogue.templates:
        entries[(up, str(tpl.get("uriTemplate")))] = tpl
    return entries
