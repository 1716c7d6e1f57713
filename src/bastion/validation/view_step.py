"""The schema step: every tool's schemas compiled once per catalogue version, and the lookup the guards use.

``CompileSchemas`` is a view step (``bastion.view``), run first on every refresh, on the definitions as the
upstream sent them: it stores each tool's compiled validators in the view (``derived[VALIDATORS]``) and
quarantines tools whose schemas are hostile or invalid. ``validators_for`` is how ``InputSchemaGuard`` and
``OutputSchemaGuard`` find them for a call, in whatever view is current when the call runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Literal

import orjson

from bastion.catalogue import UpstreamLists
from bastion.metrics import Metrics
from bastion.tool_entry import ToolEntry
from bastion.validation.compile import ToolValidators
from bastion.validation.compile_all import compile_catalogue
from bastion.validation.config import ValidationConfig
from bastion.view import View

# The key of the compiled validators in ``View.derived``.
VALIDATORS = "validators"


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
