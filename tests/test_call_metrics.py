"""The per-call series (``bastion.call_metrics``) expose what prometheus_client's own Counter and Histogram would.

The oracle is prometheus_client itself: the same observations go into its objects on one registry and into
``CallSeries`` on another, and both registries are rendered in both exposition formats. Only the ``_created``
timestamps may differ (each side stamps its own children).
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from bastion.call_metrics import CallSeries
from bastion.metrics import OVERHEAD_BUCKETS, UPSTREAM_BUCKETS, Metrics

_CREATED = re.compile(rb"^(\S+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)
_TOOLS = ["files__read", "files__write", "notes__search"]
_UPSTREAMS = ["files", "notes", ""]
_VALUES = st.one_of(st.sampled_from([0.0, *OVERHEAD_BUCKETS, *UPSTREAM_BUCKETS, 1e-9, 1e6]),
                    st.floats(min_value=0, max_value=200, allow_nan=False))


def _reference(registry: CollectorRegistry) -> tuple[Counter, Histogram, Histogram, Histogram]:
    calls = Counter("bastion_tool_calls", "tools/call requests by outcome.", ["tool", "upstream", "decision", "stage"],
                    registry=registry)
    overhead = Histogram("bastion_call_overhead_seconds",
                         "Time a tools/call spent in bastion itself (total minus upstream).",
                         buckets=OVERHEAD_BUCKETS, registry=registry)
    duration = Histogram("bastion_tool_call_duration_seconds",
                         "Time a tools/call took end to end (gateway and upstream), by tool. The first 100 tools "
                         "seen get their own series, later ones tool=\"other\".", ["tool", "upstream"],
                         buckets=UPSTREAM_BUCKETS, registry=registry)
    latency = Histogram("bastion_upstream_latency_seconds", "Time the upstream took to answer a tools/call.",
                        ["upstream"], buckets=UPSTREAM_BUCKETS, registry=registry)
    return calls, overhead, duration, latency


def _families(text: bytes) -> dict[bytes, list[bytes]]:
    """Each family's lines (HELP, TYPE, samples), sorted, with _created values blanked; families in any order."""
    text = _CREATED.sub(rb"\1 T", text)
    out: dict[bytes, list[bytes]] = {}
    name = b""
    for line in text.splitlines():
        if line.startswith(b"# HELP "):
            name = line.split()[2]
        if line == b"# EOF":
            continue
        out.setdefault(name, []).append(line)
    return {k: sorted(v) for k, v in out.items()}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_TOOLS), st.sampled_from(_UPSTREAMS), st.sampled_from(["allow", "deny"]),
                          _VALUES, _VALUES, st.one_of(st.none(), _VALUES)), max_size=30))
def test_the_same_observations_render_the_same_exposition(calls: list[tuple[str, str, str, float, float,
                                                                             float | None]]) -> None:
    theirs = CollectorRegistry(auto_describe=True)
    counter, overhead, duration, latency = _reference(theirs)
    ours = CollectorRegistry(auto_describe=True)
    series = CallSeries(histogram_tools=100, overhead_buckets=OVERHEAD_BUCKETS, upstream_buckets=UPSTREAM_BUCKETS)
    ours.register(series)
    for tool, upstream, decision, spent, total, upstream_s in calls:
        counter.labels(tool=tool, upstream=upstream, decision=decision, stage="complete").inc()
        series.tool_calls.child((tool, upstream, decision, "complete")).inc()
        overhead.observe(spent)
        series.call_overhead.child(()).observe(spent)
        duration.labels(tool=tool, upstream=upstream).observe(total)
        series.tool_duration.child((tool, upstream)).observe(total)
        if upstream_s is not None:
            latency.labels(upstream=upstream).observe(upstream_s)
            series.upstream_latency.child((upstream,)).observe(upstream_s)
    assert _families(generate_latest(ours)) == _families(generate_latest(theirs))
    assert _families(generate_openmetrics(ours)) == _families(generate_openmetrics(theirs))


def test_a_gateways_call_series_are_on_its_registry_once() -> None:
    metrics = Metrics()
    metrics.observe_call(tool="files__read", upstream="files", decision="allow", stage="complete", total_s=0.004,
                         upstream_s=0.003)
    body, _ = metrics.render()
    assert body.count(b"# TYPE bastion_tool_calls_total counter") == 1
    assert b'bastion_tool_calls_total{decision="allow",stage="complete",tool="files__read",upstream="files"} 1.0' \
        in body
    assert b'bastion_upstream_latency_seconds_bucket{le="0.005",upstream="files"} 1.0' in body
    assert b"bastion_call_overhead_seconds_count 1.0" in body
