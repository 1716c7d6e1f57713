"""Steps that turn a freshly merged catalogue into the view clients are served from.

Each step takes the previous ``View`` and returns a new one; the gateway runs them in the order the app lists
them, on every catalogue refresh, and swaps the result in whole. Per-call code never recompiles or re-checks
anything a step already decided.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Literal

import orjson
import structlog

from bastion.audit.log import AuditLog
from bastion.audit.record import catalogue_drop_record, definition_finding_record, pin_drift_record
from bastion.catalogue import Catalogue, Dropped, PromptEntry, UpstreamLists
from bastion.gateway import View, join_instructions
from bastion.metrics import Metrics
from bastion.pinning import Pinning
from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.definitions import (
    Cleaned,
    sanitize_instructions,
    sanitize_prompt_definition,
    sanitize_resource_definition,
    sanitize_tool_definition,
)
from bastion.sanitize.walk import ToolRefs, finding_class
from bastion.tool import ToolEntry
from bastion.validation import ToolValidators, ValidationConfig, compile_catalogue

VALIDATORS = "validators"
log = structlog.get_logger("bastion.views")


AuditEmit = Callable[[dict[str, Any]], Awaitable[None]]
ItemKey = tuple[str, str, str]  # (kind, upstream, item)


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

    def __init__(self, config: SanitizeConfig, emit: AuditEmit | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._emit = emit
        self._clock = clock
        self._audited: dict[ItemKey, frozenset[tuple[str, str, str]]] = {}

    async def __call__(self, view: View, lists: Mapping[str, UpstreamLists]) -> View:
        cat = view.catalogue
        refs = _refs(cat)
        seen: dict[ItemKey, frozenset[tuple[str, str, str]]] = {}
        records: list[dict[str, Any]] = []

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
                records.extend(self._records(kind, upstream, item, cleaned))

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
        if self._emit is not None:
            for record in records:
                await self._emit(record)
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

    def _records(self, kind: str, upstream: str, item: str, cleaned: Cleaned) -> list[dict[str, Any]]:
        at = self._clock()
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
        return [definition_finding_record(at=at, upstream=upstream, item_kind=kind, item=item, finding=cls,
                                          action=action, fields=fields.get(cls, ()), count=counts.get(cls, 1))
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


class AuditCatalogueDrops:
    """Last view step: one ``catalogue.drop`` record per item clients do not get as its upstream offered it.

    Covers every drop the catalogue and the steps before this one recorded (invalid or colliding names, blocked
    definitions, limits) and every quarantined tool (hostile schema, changed pinned definition, blocked
    definition), each when it first appears or its reason changes: the memory is the previous view's drops.
    """

    def __init__(self, emit: AuditEmit, clock: Callable[[], float] = time.time) -> None:
        self._emit = emit
        self._clock = clock
        self._seen: dict[tuple[str, str, str, str], str] = {}

    async def __call__(self, view: View, lists: Mapping[str, UpstreamLists]) -> View:
        # (kind, upstream, item, action) -> reason: an item both dropped once and quarantined gets both records.
        current: dict[tuple[str, str, str, str], str] = {}
        for drop in view.catalogue.dropped:
            current[(drop.kind, drop.upstream, drop.name, "dropped")] = drop.reason
        for public, reason in view.quarantined.items():
            entry = view.catalogue.tool(public)
            upstream, name = (entry.upstream, entry.original_name) if entry is not None else ("", public)
            current[("tool", upstream, name, "quarantined")] = reason
        at = self._clock()
        for key, reason in current.items():
            if self._seen.get(key) != reason:
                kind, upstream, item, action = key
                await self._emit(catalogue_drop_record(at=at, upstream=upstream, item_kind=kind, item=item,
                                                       reason=reason, action=action))
        self._seen = current
        return view


class ValidationMetricsAdapter:
    """``ValidationMetrics`` onto the Prometheus series. Rejections are counted by the audit hook, once."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def validated(self, direction: Literal["input", "output"], upstream: str, tool: str, outcome: str) -> None:
        if outcome != "reject":
            self._metrics.validation_action(direction, outcome)

    def quarantined(self, upstream: str, tool: str) -> None:
        # Compiling re-runs on every catalogue version; ``CompileSchemas`` counts a tool when it enters
        # quarantine, so a refresh that finds the same bad schema again counts nothing.
        pass

    def entered_quarantine(self, count: int) -> None:
        self._metrics.tools_quarantined(count)


class CompileSchemas:
    """Compile every tool's schemas once per catalogue version; hostile or invalid schemas quarantine the tool.

    Two things keep a large or churning catalogue from stalling the event loop (every other client's calls wait
    while it is blocked): compiled schemas are reused across versions and across tools with identical schemas
    (keyed by their canonical JSON; the cache holds the current version's schemas only), so a refresh compiles
    only what changed; and the loop is handed back every few milliseconds while compiling.
    """

    def __init__(self, config: ValidationConfig, metrics: Metrics) -> None:
        self._config = config
        self._metrics = ValidationMetricsAdapter(metrics)
        self._cache: dict[bytes, ToolValidators | str] = {}
        self._rejected: frozenset[str] = frozenset()

    async def __call__(self, view: View, lists: Mapping[str, UpstreamLists]) -> View:
        validators: dict[str, ToolValidators] = {}
        rejected: dict[str, str] = {}
        cache: dict[bytes, ToolValidators | str] = {}
        deadline = time.perf_counter() + _SLICE_S
        for entry in view.catalogue.tools:
            key = _schema_key(entry.upstream_definition)
            outcome = None if key is None else cache.get(key, self._cache.get(key))
            if outcome is None:
                compiled, reasons = compile_catalogue([entry], self._config.limits, metrics=self._metrics)
                outcome = compiled.get(entry.public_name) or reasons[entry.public_name]
            if key is not None:
                cache[key] = outcome
            if isinstance(outcome, str):
                rejected[entry.public_name] = outcome
            else:
                validators[entry.public_name] = outcome
            if time.perf_counter() >= deadline:
                await asyncio.sleep(0)
                deadline = time.perf_counter() + _SLICE_S
        self._cache = cache
        # Counted on entry, once: the same tool still quarantined by the next refresh is not a new event.
        self._metrics.entered_quarantine(len(rejected.keys() - self._rejected))
        self._rejected = frozenset(rejected)
        quarantined = {**view.quarantined, **{name: f"schema rejected: {why}" for name, why in rejected.items()}}
        return replace(view, quarantined=quarantined, derived={**view.derived, VALIDATORS: validators})


_SLICE_S = 0.005


def _schema_key(definition: Mapping[str, object]) -> bytes | None:
    """What a tool's compiled validators depend on, as canonical JSON; None if it cannot be serialised."""
    try:
        return orjson.dumps([definition.get("inputSchema"), definition.get("outputSchema")],
                            option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return None


def validators_for(current: Callable[[], View]) -> Callable[[ToolEntry], ToolValidators | None]:
    """Look a tool's compiled validators up in whatever view is current when the call runs."""

    def lookup(entry: ToolEntry) -> ToolValidators | None:
        validators: Mapping[str, ToolValidators] = current().derived.get(VALIDATORS, {})
        return validators.get(entry.public_name)

    return lookup


class PinTools:
    """Trust on first use: quarantine any tool whose definition changed since it was pinned, until approved.

    Fingerprints cover the definition as the upstream sent it, so a change is caught whether it was announced
    with ``list_changed`` or slipped into a routine refresh. Drift goes to the audit log.
    """

    def __init__(self, pinning: Pinning, audit: AuditLog,
                 on_degraded: Callable[[str], None] | None = None) -> None:
        self._pinning = pinning
        self._audit = audit
        # Told the upstream whose pins could not be checked, so the core re-checks soon instead of at the next
        # periodic refresh (a minute by default) after the store answers again.
        self._on_degraded = on_degraded

    async def __call__(self, view: View, lists: Mapping[str, UpstreamLists]) -> View:
        quarantined = dict(view.quarantined)
        by_original = {(t.upstream, t.original_name): t.public_name for t in view.catalogue.tools}
        for name, up in lists.items():
            outcome = await self._pinning.reconcile(name, [dict(t) for t in up.tools])
            if outcome.degraded and self._on_degraded is not None:
                self._on_degraded(name)
            for tool in outcome.quarantined:
                public = by_original.get((name, tool))
                if public is not None:
                    quarantined[public] = "definition changed since it was pinned; awaiting approval" \
                        if not outcome.degraded else "pin store unavailable; definition not verified"
            # The pinning service logs every event itself; drift also belongs in the audit log.
            for event in outcome.events:
                if event.event == "pin.drift":
                    await self._audit.emit(pin_drift_record(
                        at=time.time(), upstream=event.upstream, tool=event.tool,
                        pinned=event.old_fingerprint or "", observed=event.new_fingerprint,
                        action="blocked" if event.action == "quarantined" else "warned"))
        return replace(view, quarantined=quarantined)
