"""The series every ``tools/call`` updates, as plain numbers: one counter and three histograms.

prometheus_client's ``Counter`` and ``Histogram`` take a lock for every increment and find a histogram's bucket
with a Python loop over its bounds: a call's four updates (the call counter, its duration, bastion's overhead, the
upstream's latency: seven locked increments) cost about 39,000 instructions, a twentieth of a forwarded call's
whole cost with every guard off. Here each series is a list of bucket counts and a sum, its bucket found by
``bisect``, and the families are built when Prometheus scrapes (``collect``), with the names, help texts, samples
and ``_created`` series prometheus_client gives them.

No lock: every update runs on the event loop's thread (the pipeline's audit hook), and so does a scrape (the
``/metrics`` endpoint). A scrape from another thread would still be safe: it walks a copy of each family's
children (``list`` of a dict's items runs without releasing the GIL), and could at worst see a count a call ahead
of its sum, as prometheus_client's separately locked values can.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import cast

from prometheus_client import metrics as prometheus_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# prometheus_client's own formatting of a bucket bound (untyped there).
_go_float = cast(Callable[[float], str], floatToGoString)

__all__ = ["CallSeries", "CounterFamily", "CounterSeries", "HistogramFamily", "HistogramSeries"]


class CounterSeries:
    """One labelled child of a counter."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self) -> None:
        self.value += 1.0


class HistogramSeries:
    """One labelled child of a histogram: a count per bucket (not cumulated) and the sum."""

    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # The first bucket whose upper bound is >= value, as prometheus_client's loop finds it; a NaN is in none.
        if value == value:
            self.counts[bisect.bisect_left(self._bounds, value)] += 1.0
        self.sum += value


class CounterFamily:
    """A counter's name, help, label names, and its children by label values."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], CounterSeries] = {}

    def child(self, values: tuple[str, ...]) -> CounterSeries:
        found = self.children.get(values)
        if found is None:
            found = self.children[values] = CounterSeries()
        return found

    def metric(self, created: bool) -> Metric:
        family = Metric(self.name, self.documentation, "counter")
        for values, series in list(self.children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            family.add_sample(self.name + "_total", labels, series.value)
            if created:
                family.add_sample(self.name + "_created", labels, series.created)
        return family


class HistogramFamily:
    """A histogram's name, help, label names and bucket bounds, and its children by label values."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], bounds: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        # As prometheus_client keeps them: the bounds given, then +Inf; and their "le" texts, as it writes them.
        self.bounds = (*bounds, math.inf)
        self._le = tuple(_go_float(bound) for bound in self.bounds)
        self.children: dict[tuple[str, ...], HistogramSeries] = {}
        if not self.labelnames:
            self.child(())  # an unlabelled histogram exists from the start, reading 0

    def child(self, values: tuple[str, ...]) -> HistogramSeries:
        found = self.children.get(values)
        if found is None:
            found = self.children[values] = HistogramSeries(self.bounds)
        return found

    def metric(self, created: bool) -> Metric:
        family = Metric(self.name, self.documentation, "histogram")
        for values, series in list(self.children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            cumulated = 0.0
            for le, count in zip(self._le, series.counts, strict=True):
                cumulated += count
                family.add_sample(self.name + "_bucket", {**labels, "le": le}, cumulated)
            family.add_sample(self.name + "_count", labels, cumulated)
            if self.bounds[0] >= 0:
                family.add_sample(self.name + "_sum", labels, series.sum)
            if created:
                family.add_sample(self.name + "_created", labels, series.created)
        return family


class CallSeries(Collector):
    """The families a finished call updates; registered on the gateway's registry like any collector."""

    def __init__(self, *, histogram_tools: int, overhead_buckets: Sequence[float],
                 upstream_buckets: Sequence[float]) -> None:
        self.tool_calls = CounterFamily("bastion_tool_calls", "tools/call requests by outcome.",
                                        ["tool", "upstream", "decision", "stage"])
        self.call_overhead = HistogramFamily("bastion_call_overhead_seconds",
                                             "Time a tools/call spent in bastion itself (total minus upstream).", [],
                                             overhead_buckets)
        self.tool_duration = HistogramFamily("bastion_tool_call_duration_seconds",
                                             "Time a tools/call took end to end (gateway and upstream), by tool. The "
                                             f"first {histogram_tools} tools seen get their own series, later ones "
                                             "tool=\"other\".", ["tool", "upstream"], upstream_buckets)
        self.upstream_latency = HistogramFamily("bastion_upstream_latency_seconds",
                                                "Time the upstream took to answer a tools/call.", ["upstream"],
                                                upstream_buckets)
        self._families: tuple[CounterFamily | HistogramFamily, ...] = (
            self.tool_calls, self.call_overhead, self.tool_duration, self.upstream_latency)

    def collect(self) -> Iterator[Metric]:
        # prometheus_client's own switch for the _created series (PROMETHEUS_DISABLE_CREATED_SERIES, or
        # disable_created_metrics()), read at every scrape as its collectors read it.
        created = bool(getattr(prometheus_metrics, "_use_created", True))
        for family in self._families:
            yield family.metric(created)

    def describe(self) -> Iterator[Metric]:
        for family in self._families:
            yield Metric(family.name, family.documentation,
                         "counter" if isinstance(family, CounterFamily) else "histogram")
