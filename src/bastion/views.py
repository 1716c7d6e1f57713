"""Steps that turn a freshly merged catalogue into the view clients are served from.

Each step takes the previous ``View`` and returns a new one; the gateway runs them in the order the app lists
them, on every catalogue refresh, and swaps the result in whole. Per-call code never recompiles or re-checks
anything a step already decided.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Literal

import structlog

from bastion.audit.log import AuditLog
from bastion.audit.record import pin_drift_record
from bastion.catalogue import PromptEntry, UpstreamLists
from bastion.gateway import View
from bastion.metrics import Metrics
from bastion.pinning import Pinning
from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.definitions import (
    sanitize_instructions,
    sanitize_prompt_definition,
    sanitize_resource_definition,
    sanitize_tool_definition,
)
from bastion.sanitize.report import SanitizeReport
from bastion.tool import ToolEntry
from bastion.validation import ToolValidators, ValidationConfig, compile_catalogue

VALIDATORS = "validators"
log = structlog.get_logger("bastion.views")


class SanitizeDefinitions:
    """Clean what clients read about tools, prompts and resources, and log what was hidden in it.

    Definitions are the other channel a poisoned upstream can use to reach a model, so their text is cleaned like
    results. Only the public ``definition`` changes; ``upstream_definition`` stays as sent, for fingerprints and
    schema compilation.
    """

    def __init__(self, config: SanitizeConfig) -> None:
        self._config = config

    def _note(self, kind: str, upstream: str, name: str, report: SanitizeReport) -> None:
        if report.findings:
            log.warning("sanitize.definition_findings", kind=kind, upstream=upstream, name=name,
                        findings=sorted({f"{f.where}:{f.kind}" for f in report.findings})[:20])

    async def __call__(self, view: View, lists: Mapping[str, UpstreamLists]) -> View:
        cat = view.catalogue
        tools = []
        for entry in cat.tools:
            policy = self._config.for_upstream(entry.upstream)
            if not policy.enabled:
                tools.append(entry)
                continue
            clean, report = sanitize_tool_definition(entry.definition, policy)
            self._note("tool", entry.upstream, entry.public_name, report)
            tools.append(replace(entry, definition=clean))
        prompts = []
        for prompt in cat.prompts:
            policy = self._config.for_upstream(prompt.upstream)
            clean, report = sanitize_prompt_definition(prompt.definition, policy) if policy.enabled \
                else (dict(prompt.definition), SanitizeReport())
            self._note("prompt", prompt.upstream, prompt.public_name, report)
            prompts.append(PromptEntry(prompt.public_name, prompt.upstream, prompt.original_name, clean))
        resources = tuple((up, self._resource(up, res)) for up, res in cat.resources)
        templates = tuple((up, self._resource(up, res)) for up, res in cat.templates)
        instructions = view.instructions
        if instructions:
            # Server instructions go straight into a model's context at initialize: same cleaning, default policy.
            instructions, report = sanitize_instructions(instructions, self._config.for_upstream(""))
            self._note("instructions", "*", "instructions", report)
        return replace(view, instructions=instructions,
                       catalogue=cat.replaced(tools=tools, prompts=prompts, resources=resources, templates=templates))

    def _resource(self, upstream: str, resource: Mapping[str, object]) -> Mapping[str, object]:
        policy = self._config.for_upstream(upstream)
        if not policy.enabled:
            return resource
        clean, report = sanitize_resource_definition(resource, policy)
        self._note("resource", upstream, str(resource.get("uri") or resource.get("uriTemplate")), report)
        return clean


class ValidationMetricsAdapter:
    """``ValidationMetrics`` onto the Prometheus series. Rejections are counted by the audit hook, once."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def validated(self, direction: Literal["input", "output"], upstream: str, tool: str, outcome: str) -> None:
        if outcome != "reject":
            self._metrics.validation_action(direction, outcome)

    def quarantined(self, upstream: str, tool: str) -> None:
        self._metrics.validation_action("input", "quarantined")


class CompileSchemas:
    """Compile every tool's schemas once per catalogue version; hostile or invalid schemas quarantine the tool."""

    def __init__(self, config: ValidationConfig, metrics: Metrics) -> None:
        self._config = config
        self._metrics = ValidationMetricsAdapter(metrics)

    async def __call__(self, view: View, lists: Mapping[str, UpstreamLists]) -> View:
        validators, rejected = compile_catalogue(view.catalogue.tools, self._config.limits, metrics=self._metrics)
        quarantined = {**view.quarantined, **{name: f"schema rejected: {why}" for name, why in rejected.items()}}
        return replace(view, quarantined=quarantined, derived={**view.derived, VALIDATORS: validators})


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
