"""The definition step: what clients read about tools, prompts, resources and instructions, cleaned.

A view step (``bastion.view``), run on every catalogue refresh after the schemas are compiled from what the
upstream sent: it rewrites each item's public ``definition`` with the sanitizer's definition rules
(``bastion.sanitize.definitions``), acts on what they find (a blocked tool is quarantined, a blocked prompt,
resource or template leaves the catalogue) and writes one ``definition.finding`` record per finding class and
item when the item's findings change.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypedDict

import orjson
import structlog

from bastion.audit.events import AuditEvents
from bastion.catalogue import Catalogue, Dropped, PromptEntry, UpstreamLists
from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.definitions import (
    Cleaned,
    sanitize_instructions,
    sanitize_prompt_definition,
    sanitize_resource_definition,
    sanitize_tool_definition,
)
from bastion.sanitize.walk import ToolRefs, finding_class
from bastion.view import View, join_instructions

# The logger name these warnings always had: log pipelines may filter on it.
log = structlog.get_logger("bastion.views")

ItemKey = tuple[str, str, str]  # (kind, upstream, item)
# Hand the event loop back this often while cleaning a large catalogue.
_SLICE_S = 0.005


class SanitizeDefinitions:
    """Clean what clients read about tools, prompts, resources and instructions; act on and audit findings.

    Definitions are the other channel a poisoned upstream can use to reach a model, so their text is cleaned like
    results, and ``sanitize.definitions`` decides what a finding does (``bastion.sanitize.definitions``): a
    blocked tool is quarantined, a blocked prompt, resource or template leaves the catalogue. Only the public
    ``definition`` changes; ``upstream_definition`` stays as sent, for fingerprints and schema compilation.

    One ``definition.finding`` record per finding class and item, written when the item's findings first
    appear or change (another class, another action, a changed definition), not on every periodic refresh: the
    step remembers what it audited for the items of the previous view, and only for those.
    """

    def __init__(self, config: SanitizeConfig, events: AuditEvents | None = None) -> None:
        self._config = config
        self._events = events
        self._audited: dict[ItemKey, frozenset[tuple[str, str, str]]] = {}

    async def __call__(self, view: View, lists: Mapping[str, UpstreamLists]) -> View:
        cat = view.catalogue
        refs = _refs(cat)
        seen: dict[ItemKey, frozenset[tuple[str, str, str]]] = {}
        findings: list[Finding] = []

        def judge(kind: str, upstream: str, item: str, source: object, cleaned: Cleaned) -> None:
            key = (kind, upstream, item)
            if cleaned.report.findings:
                log.warning("sanitize.definition_findings", kind=kind, upstream=upstream, name=item,
                            actions=dict(cleaned.actions),
                            findings=sorted({f"{f.where}:{f.kind}" for f in cleaned.report.findings})[:20])
            if not cleaned.actions:
                return
            digest = hashlib.sha256(orjson.dumps(source, option=orjson.OPT_SORT_KEYS, default=str)).hexdigest()
            signature = frozenset((cls, action, digest) for cls, action in cleaned.actions.items())
            seen[key] = signature
            if self._audited.get(key) != signature:
                findings.extend(_findings(kind, upstream, item, cleaned))

        quarantined = dict(view.quarantined)
        dropped = list(cat.dropped)
        tools = []
        deadline = time.perf_counter() + _SLICE_S
        for entry in cat.tools:
            if time.perf_counter() >= deadline:
                # Hand the loop back every few ms (as CompileSchemas does): a huge catalogue must not stall calls.
                await asyncio.sleep(0)
                deadline = time.perf_counter() + _SLICE_S
            policy = self._config.for_tool(entry.upstream, entry.original_name)
            if not policy.enabled:
                tools.append(entry)
                continue
            cleaned = sanitize_tool_definition(entry.definition, policy, refs=refs.get(entry.upstream))
            judge("tool", entry.upstream, entry.original_name, entry.upstream_definition, cleaned)
            if cleaned.blocked:
                quarantined.setdefault(entry.public_name, _blocked_reason(cleaned))
            tools.append(replace(entry, definition=cleaned.definition))
        prompts = []
        for prompt in cat.prompts:
            policy = self._config.for_upstream(prompt.upstream)
            if not policy.enabled:
                prompts.append(prompt)
                continue
            cleaned = sanitize_prompt_definition(prompt.definition, policy, refs=refs.get(prompt.upstream))
            judge("prompt", prompt.upstream, prompt.original_name, prompt.definition, cleaned)
            if cleaned.blocked:
                dropped.append(Dropped(prompt.upstream, prompt.original_name, _blocked_reason(cleaned), "prompt"))
                continue
            prompts.append(PromptEntry(prompt.public_name, prompt.upstream, prompt.original_name,
                                       cleaned.definition))
        prefixes = {up: prefix for prefix, up in cat.prefixes.items()}
        resources = self._resources(cat.resources, "resource", "uri", prefixes, refs, judge, dropped)
        templates = self._resources(cat.templates, "template", "uriTemplate", prefixes, refs, judge, dropped)
        parts = []
        for upstream, text in view.upstream_instructions:
            policy = self._config.for_upstream(upstream)
            if not policy.enabled:
                parts.append((upstream, text))
                continue
            cleaned = sanitize_instructions(text, policy, refs=refs.get(upstream))
            judge("instructions", upstream, "instructions", text, cleaned)
            if not cleaned.blocked:
                parts.append((upstream, cleaned.definition))
        instructions = join_instructions(parts) if view.upstream_instructions else view.instructions
        self._audited = seen
        if self._events is not None:
            for finding in findings:
                await self._events.definition_finding(**finding)
        catalogue = cat.replaced(tools=tools, prompts=prompts, resources=resources, templates=templates)
        return replace(view, instructions=instructions, quarantined=quarantined,
                       catalogue=replace(catalogue, dropped=tuple(dropped)))

    def _resources(self, items: tuple[tuple[str, Mapping[str, Any]], ...], kind: str, key: str,
                   prefixes: Mapping[str, str], refs: Mapping[str, ToolRefs],
                   judge: Callable[[str, str, str, object, Cleaned], None],
                   dropped: list[Dropped]) -> list[tuple[str, Mapping[str, Any]]]:
        out: list[tuple[str, Mapping[str, Any]]] = []
        for upstream, resource in items:
            policy = self._config.for_upstream(upstream)
            if not policy.enabled:
                out.append((upstream, resource))
                continue
            # Audited under the upstream's own URI, like tools under their upstream-side name.
            name = str(resource.get(key)).removeprefix(f"{prefixes[upstream]}+" if upstream in prefixes else "")
            cleaned = sanitize_resource_definition(resource, policy, refs=refs.get(upstream))
            judge(kind, upstream, name, resource, cleaned)
            if cleaned.blocked:
                dropped.append(Dropped(upstream, name, _blocked_reason(cleaned), kind))
                continue
            out.append((upstream, cleaned.definition))
        return out


class Finding(TypedDict):
    """One ``definition.finding`` record's fields (``AuditEvents.definition_finding``)."""

    upstream: str
    item_kind: str
    item: str
    finding: str
    action: str
    fields: Sequence[str]
    count: int


def _findings(kind: str, upstream: str, item: str, cleaned: Cleaned) -> list[Finding]:
    """One per finding class acted on, with the fields it was found in and how often."""
    fields: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for key, n in cleaned.report.counts.items():
        cls = finding_class(key)
        if cls is not None:
            counts[cls] = counts.get(cls, 0) + n
    for finding in cleaned.report.findings:
        cls = finding_class(finding.kind)
        if cls is not None:
            fields.setdefault(cls, []).append(finding.where)
    return [Finding(upstream=upstream, item_kind=kind, item=item, finding=cls, action=action,
                    fields=fields.get(cls, ()), count=counts.get(cls, 1))
            for cls, action in sorted(cleaned.actions.items())]


def _blocked_reason(cleaned: Cleaned) -> str:
    classes = ", ".join(sorted(c for c, a in cleaned.actions.items() if a == "blocked"))
    return f"definition blocked by the sanitizer: {classes}"


def _refs(cat: Catalogue) -> dict[str, ToolRefs]:
    """Per upstream: the names of tools other upstreams serve (public and upstream-side)."""
    names: dict[str, set[str]] = {}
    for entry in cat.tools:
        names.setdefault(entry.upstream, set()).update((entry.public_name, entry.original_name))
    # The distinctive names are picked once; each upstream's refs are that set less its own names.
    every = ToolRefs(set().union(*names.values()) if names else set())
    upstreams = {up for up, _ in (*cat.resources, *cat.templates)} | {p.upstream for p in cat.prompts} | set(names)
    return {up: every.without(names.get(up, set())) for up in upstreams}
