"""Prometheus metrics: one ``Metrics`` object per gateway, owning its own registry.

No global registry: two gateways in one process (tests, embedding) never share or collide, and ``render`` shows
exactly bastion's series. Label values are bounded twice: every label comes from a closed set or from config
and the catalogue, and ``LabelCap`` still folds anything past ``max_label_values`` distinct values per label into
``other``, so a misbehaving upstream that advertises thousands of tools cannot blow up the time-series database.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import choose_encoder

from bastion.call_metrics import CallSeries, CounterSeries, HistogramSeries

__all__ = ["OVERHEAD_BUCKETS", "TOOL_HISTOGRAM_TOOLS", "UPSTREAM_BUCKETS", "LabelCap", "Metrics"]

# Gateway overhead is expected in the tens to hundreds of microseconds; the default buckets start at 5 ms and
# would put every observation in the first one.
OVERHEAD_BUCKETS: tuple[float, ...] = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                       0.1, 0.25, 1.0)
UPSTREAM_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                                       60.0, 120.0)
# Per-tool latency: one histogram series set per tool is the costliest label in bastion (buckets + 3 series
# each), so it gets its own, smaller cap: the first TOOL_HISTOGRAM_TOOLS tools seen get their own histogram,
# later ones share ``tool="other"``. The call counter keeps the full ``max_label_values`` cap.
TOOL_HISTOGRAM_TOOLS = 100
OTHER = "other"
_HEALTH_STATES = ("up", "degraded", "down", "restarting")
_MAX_VALUE_LEN = 128
# Distinct (tool, upstream, decision, stage) combinations whose series ``observe_call`` keeps at hand; past it,
# further combinations are resolved on every call as before (the cache only saves time, it never decides a label).
_CALL_SERIES_CACHE = 10_000


class LabelCap:
    """Remembers up to ``limit`` distinct values per label name; later new values become ``other``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: dict[str, set[str]] = {}

    def __call__(self, label: str, value: str | None) -> str:
        text = (value or "")[:_MAX_VALUE_LEN]
        seen = self._seen.setdefault(label, set())
        if text in seen:
            return text
        if len(seen) >= self.limit:
            return OTHER
        seen.add(text)
        return text


class Metrics:
    """Every series bastion exports. The core calls the methods; nothing else touches the collectors."""

    def __init__(self, *, max_label_values: int = 1000, histogram_tools: int = TOOL_HISTOGRAM_TOOLS) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._cap = LabelCap(max_label_values)
        self._histogram_cap = LabelCap(histogram_tools)
        r = self.registry
        # The four series every call updates (bastion_tool_calls, bastion_call_overhead_seconds,
        # bastion_tool_call_duration_seconds, bastion_upstream_latency_seconds): plain numbers, see call_metrics.
        self.calls = CallSeries(histogram_tools=histogram_tools, overhead_buckets=OVERHEAD_BUCKETS,
                                upstream_buckets=UPSTREAM_BUCKETS)
        r.register(self.calls)
        self._overhead = self.calls.call_overhead.child(())
        self.catalogue_refreshes = Counter("bastion_catalogue_refreshes",
                                           "Fetches of an upstream's lists (outcome: ok|error|failed).",
                                           ["upstream", "outcome"], registry=r)
        self.sessions_started = Counter("bastion_sessions_started", "Client sessions opened.", registry=r)
        self.ratelimit_rejections = Counter("bastion_ratelimit_rejections", "Calls refused by a rate limit.",
                                            ["limit"], registry=r)
        self.validation_actions = Counter("bastion_validation_actions",
                                          "Schema validation outcomes (direction: input|output).",
                                          ["direction", "action"], registry=r)
        self.sanitize_actions = Counter("bastion_sanitize_actions", "Redactions and other sanitizer actions.",
                                        ["class"], registry=r)
        self.upstream_up = Gauge("bastion_upstream_up", "1 when the upstream is connected and answering.",
                                 ["upstream"], registry=r)
        self.catalogue_tools = Gauge("bastion_catalogue_tools", "Tools in the merged catalogue.", registry=r)
        self.active_sessions = Gauge("bastion_active_sessions", "Open client sessions.", registry=r)
        self.policy_reloads = Counter("bastion_policy_reloads", "Policy reload attempts by outcome.", ["outcome"],
                                      registry=r)
        # A state, not an event: a counter's increase ends with its window while the files stay broken.
        self.policy_reload_failing = Gauge("bastion_policy_reload_failing",
                                           "1 while the policy files on disk cannot be loaded (the last good policy "
                                           "is in force), else 0.", registry=r)
        self.api_key_reloads = Counter("bastion_api_keys_reloads", "API key file reloads by outcome.", ["outcome"],
                                       registry=r)
        self.api_key_reload_failing = Gauge("bastion_api_keys_reload_failing",
                                            "1 while the API key file on disk cannot be loaded (the last good key "
                                            "table is in force, revocations in the file included), else 0.",
                                            registry=r)
        self.audit_sink_failures = Counter("bastion_audit_sink_failures", "Audit records a sink failed to write.",
                                           ["sink"], registry=r)
        self.policy_denials = Counter("bastion_policy_denials", "Calls denied by the access policy, by rule.",
                                      ["rule"], registry=r)
        self.approvals = Counter("bastion_approvals", "Calls held for human approval, by how the approval ended "
                                 "(approved, declined, timed_out, withdrawn, refused, unavailable) and the channel "
                                 "that ended it.", ["outcome", "channel"], registry=r)
        self.upstream_stray_responses = Counter(
            "bastion_upstream_stray_responses", "Upstream responses dropped because they answered no request of "
            "their stream (reason: unknown_id, late, duplicate, wrong_stream, malformed_id).",
            ["upstream", "reason"], registry=r)
        self.upstream_server_requests_refused = Counter(
            "bastion_upstream_server_requests_refused", "Requests an upstream sent bastion (sampling, elicitation, "
            "roots/list, ping) refused with a JSON-RPC error (reason: too_many, duplicate_id, not_accepted, "
            "no_call, ambiguous).", ["upstream", "reason"], registry=r)
        self.upstream_stderr_lines = Counter(
            "bastion_upstream_stderr_lines", "Lines a stdio upstream wrote to stderr, by what became of them: logged, "
            "truncated (logged cut at stderr.max_line_size) or suppressed (over the stderr rate limit).",
            ["upstream", "outcome"], registry=r)
        self.upstream_state = Gauge("bastion_upstream_state",
                                    "1 for the upstream's current health state (up, degraded, down, restarting).",
                                    ["upstream", "state"], registry=r)
        self.upstream_transitions = Counter("bastion_upstream_transitions",
                                            "Upstream health state changes, by the state entered.",
                                            ["upstream", "state"], registry=r)
        self.upstream_restarts = Counter("bastion_upstream_restarts",
                                         "Times an upstream's transport lost its connection and began re-establishing "
                                         "it (stdio child respawn, SSE stream re-open, frozen HTTP session left for "
                                         "a new one).", ["upstream"], registry=r)
        # Created on first use: an unlabelled gauge exists from construction and would read 0 (firing
        # BastionLimiterRedisDown) on a gateway whose limiter never uses Redis.
        self.limiter_redis_up: Gauge | None = None
        self.redis_up = Gauge("bastion_redis_up", "1 when Redis answers this use (sessions|limiter|pins).", ["use"],
                              registry=r)
        self.session_fallbacks = Counter("bastion_session_store_fallbacks",
                                         "Session operations decided locally because Redis was down, and their "
                                         "later replay (event: served_local|refused|created_local|updated_local|"
                                         "deleted_local|synced).", ["event"], registry=r)
        self.pin_store_failures = Counter("bastion_pin_store_failures",
                                          "Catalogue refreshes that could not reach the pin store (mode: static = "
                                          "last verified pins kept, closed = nothing verified yet, tools hidden).",
                                          ["mode"], registry=r)
        self.relay_dropped_messages = Counter(
            "bastion_relay_dropped", "Messages for a client that a full stream queue coalesced or dropped "
            "(queue: call, session; kind: progress, log, resource_updated, list_changed, request, other).",
            ["queue", "kind"], registry=r)
        self.http_refusals = Counter("bastion_http_refusals",
                                     "Requests the front door refused at the HTTP level, mostly before authentication.",
                                     ["reason"], registry=r)
        # The labelled children one finished call updates, per raw (tool, upstream, decision, stage): resolving
        # labels (caps, then prometheus' validation and lookup under a lock) cost more than the updates. Exact:
        # a cap maps a value the same way for good once it has seen it (its sets only grow), and children are
        # never removed.
        self._call_series: dict[tuple[str, str | None, str, str], tuple[CounterSeries, HistogramSeries]] = {}
        self._latency_series: dict[str, HistogramSeries] = {}

    def observe_call(self, *, tool: str, upstream: str | None, decision: str, stage: str,
                     total_s: float, upstream_s: float | None) -> None:
        """One finished tools/call. Overhead is ``total_s - upstream_s``; upstream latency only if it was called."""
        key = (tool, upstream, decision, stage)
        series = self._call_series.get(key)
        if series is None:
            series = self._resolve_call_series(key)
        calls, duration = series
        calls.inc()
        self._overhead.observe(max(0.0, total_s - (upstream_s or 0.0)))
        duration.observe(max(0.0, total_s))
        if upstream_s is not None and upstream is not None:
            # Resolved only once a call reached the upstream: until then the series does not exist.
            latency = self._latency_series.get(upstream)
            if latency is None:
                latency = self.calls.upstream_latency.child((self._cap("upstream", upstream),))
                if len(self._latency_series) < _CALL_SERIES_CACHE:
                    self._latency_series[upstream] = latency
            latency.observe(max(0.0, upstream_s))

    def _resolve_call_series(self, key: tuple[str, str | None, str, str]) -> tuple[CounterSeries, HistogramSeries]:
        tool, upstream, decision, stage = key
        # The caps are consulted in the order the labels were always resolved, so they fill up as before.
        calls = self.calls.tool_calls.child((self._cap("tool", tool), self._cap("upstream", upstream),
                                             self._cap("decision", decision), self._cap("stage", stage)))
        duration = self.calls.tool_duration.child((self._histogram_cap("tool", tool),
                                                   self._cap("upstream", upstream)))
        if len(self._call_series) < _CALL_SERIES_CACHE:
            self._call_series[key] = (calls, duration)
        return calls, duration

    def ratelimit_rejected(self, limit: str) -> None:
        self.ratelimit_rejections.labels(limit=self._cap("limit", limit)).inc()

    def approval_outcome(self, outcome: str, channel: str) -> None:
        """One held call's approval ended (labels are bastion's own fixed vocabularies)."""
        self.approvals.labels(outcome=outcome, channel=channel).inc()

    def policy_denied(self, rule: str | None) -> None:
        """``rule``: the deciding rule id; ``default`` when no rule matched (default deny)."""
        self.policy_denials.labels(rule=self._cap("rule", rule or "default")).inc()

    def validation_action(self, direction: Literal["input", "output"], action: str) -> None:
        """``action``: e.g. ``passed``, ``rejected``, ``skipped`` (no schema), ``withheld``."""
        self.validation_actions.labels(direction=direction, action=self._cap("action", action)).inc()

    def tools_quarantined(self, count: int) -> None:
        """``count`` tools entered schema quarantine (``validation_actions{direction=input,action=quarantined}``)."""
        if count > 0:
            self.validation_actions.labels(direction="input", action="quarantined").inc(count)

    def sanitize_counts(self, counts: dict[str, int]) -> None:
        """Add a call's sanitizer counts (class -> number of actions), as recorded on the ``CallRecord``."""
        for cls, n in counts.items():
            if n > 0:
                self.sanitize_actions.labels(**{"class": self._cap("class", cls)}).inc(n)

    def set_upstream_up(self, upstream: str, up: bool) -> None:
        self.upstream_up.labels(upstream=self._cap("upstream", upstream)).set(1 if up else 0)

    def upstream_health(self, upstream: str, state: str, *, previous: str | None = None) -> None:
        """An upstream entered ``state`` (``previous``: the state it left, ``None`` at declaration)."""
        name = self._cap("upstream", upstream)
        for each in _HEALTH_STATES:
            self.upstream_state.labels(upstream=name, state=each).set(1 if each == state else 0)
        self.upstream_up.labels(upstream=name).set(1 if state in ("up", "degraded") else 0)
        if previous is not None:
            self.upstream_transitions.labels(upstream=name, state=state).inc()
            if state == "restarting":
                self.upstream_restarts.labels(upstream=name).inc()

    def set_catalogue_tools(self, count: int) -> None:
        self.catalogue_tools.set(count)

    def session_opened(self) -> None:
        """A session the store holds: in the gauge at once (the sweeper sets it from the store's own count)."""
        self.active_sessions.inc()

    def session_started(self) -> None:
        """A session whose start was recorded: the client learnt its id."""
        self.sessions_started.inc()

    def catalogue_refreshed(self, upstream: str, outcome: Literal["ok", "error", "failed"]) -> None:
        """One fetch of ``upstream``'s lists: ``ok``, ``error`` (it answered with an error), ``failed`` (no answer)."""
        self.catalogue_refreshes.labels(upstream=self._cap("upstream", upstream), outcome=outcome).inc()

    def session_closed(self) -> None:
        self.active_sessions.dec()

    def set_active_sessions(self, count: int) -> None:
        self.active_sessions.set(count)

    def policy_reloaded(self, outcome: Literal["applied", "rejected", "unchanged"]) -> None:
        """Every outcome the watcher reports: a rejection starts a failure, and a swap or a return to the set in
        force (``unchanged``) ends it."""
        self.policy_reloads.labels(outcome=outcome).inc()
        self.policy_reload_failing.set(1 if outcome == "rejected" else 0)

    def api_keys_reloaded(self, outcome: Literal["applied", "rejected", "unchanged"]) -> None:
        """Every outcome the key file's watcher reports, as ``policy_reloaded`` for the policy files."""
        self.api_key_reloads.labels(outcome=outcome).inc()
        self.api_key_reload_failing.set(1 if outcome == "rejected" else 0)

    def audit_sink_failed(self, sink: str) -> None:
        """Matches ``AuditLog(on_sink_failure=...)``."""
        self.audit_sink_failures.labels(sink=self._cap("sink", sink)).inc()

    def upstream_stray_response(self, upstream: str, reason: str) -> None:
        """Matches ``build_upstream(on_stray=...)``."""
        self.upstream_stray_responses.labels(upstream=self._cap("upstream", upstream),
                                             reason=self._cap("reason", reason)).inc()

    def upstream_server_request_refused(self, upstream: str, reason: str) -> None:
        """Matches ``build_upstream(on_refused=...)``; ``reason`` is a closed set (``session.REFUSAL_REASONS``)."""
        self.upstream_server_requests_refused.labels(upstream=self._cap("upstream", upstream),
                                                     reason=self._cap("reason", reason)).inc()

    def relay_dropped(self, queue: str, kind: str) -> None:
        """Matches ``Gateway.relay_dropped`` (``bastion.backlog.DropHook``); both labels are closed sets."""
        self.relay_dropped_messages.labels(queue=self._cap("queue", queue), kind=self._cap("kind", kind)).inc()

    def upstream_stderr(self, upstream: str, outcome: str, lines: int) -> None:
        """Matches ``build_upstream(on_stderr=...)``."""
        self.upstream_stderr_lines.labels(upstream=self._cap("upstream", upstream),
                                          outcome=self._cap("outcome", outcome)).inc(lines)

    def set_limiter_redis_up(self, up: bool) -> None:
        if self.limiter_redis_up is None:
            self.limiter_redis_up = Gauge("bastion_limiter_redis_up", "1 when the rate limiter's Redis answers.",
                                          registry=self.registry)
        self.limiter_redis_up.set(1 if up else 0)
        self.redis_up.labels(use="limiter").set(1 if up else 0)

    def set_redis_up(self, use: Literal["sessions", "limiter", "pins"], up: bool) -> None:
        self.redis_up.labels(use=use).set(1 if up else 0)

    def session_fallback(self, event: str) -> None:
        """A ``FallbackSessionStore`` event; the outage edges (``unavailable``/``recovered``) drive the gauge."""
        if event in ("unavailable", "recovered"):
            self.set_redis_up("sessions", event == "recovered")
        else:
            self.session_fallbacks.labels(event=self._cap("event", event)).inc()

    def pin_store_failed(self, mode: Literal["static", "closed"]) -> None:
        self.pin_store_failures.labels(mode=mode).inc()

    def http_refused(self, reason: str) -> None:
        """``reason``: one of ``bastion.server.refusals.REFUSAL_REASONS`` (a closed set)."""
        self.http_refusals.labels(reason=self._cap("reason", reason)).inc()

    def declare_upstreams(self, names: Sequence[str]) -> None:
        """Create the per-upstream series at start, so a never-connected upstream shows ``up 0`` not nothing."""
        for name in names:
            self.set_upstream_up(name, False)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition body and its content type; OpenMetrics when the scraper's ``Accept`` asks for it."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
