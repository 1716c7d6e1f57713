from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from bastion.metrics import OVERHEAD_BUCKETS, LabelCap, Metrics

EXPECTED = {
    "bastion_tool_calls": "counter",
    "bastion_call_overhead_seconds": "histogram",
    "bastion_upstream_latency_seconds": "histogram",
    "bastion_ratelimit_rejections": "counter",
    "bastion_validation_actions": "counter",
    "bastion_sanitize_actions": "counter",
    "bastion_upstream_up": "gauge",
    "bastion_catalogue_tools": "gauge",
    "bastion_active_sessions": "gauge",
    "bastion_policy_reloads": "counter",
    "bastion_policy_reload_failing": "gauge",
    "bastion_api_keys_reloads": "counter",
    "bastion_api_keys_reload_failing": "gauge",
    "bastion_audit_sink_failures": "counter",
    "bastion_policy_denials": "counter",
    "bastion_limiter_redis_up": "gauge",
    "bastion_tool_call_duration_seconds": "histogram",
    "bastion_catalogue_refreshes": "counter",
    "bastion_sessions_started": "counter",
    "bastion_upstream_state": "gauge",
    "bastion_upstream_transitions": "counter",
    "bastion_upstream_restarts": "counter",
}


def _scrape(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def _exercise(m: Metrics) -> None:
    m.declare_upstreams(["files", "github"])
    m.observe_call(tool="files__read", upstream="files", decision="allow", stage="complete", total_s=0.0123,
                   upstream_s=0.0120)
    m.observe_call(tool="files__read", upstream="files", decision="deny", stage="policy", total_s=0.0002,
                   upstream_s=None)
    m.ratelimit_rejected("per-principal")
    m.validation_action("input", "rejected")
    m.validation_action("output", "passed")
    m.sanitize_counts({"aws_key": 2, "email": 0})
    m.set_upstream_up("files", True)
    m.set_catalogue_tools(42)
    m.session_opened()
    m.session_started()
    m.session_opened()
    m.session_started()
    m.session_closed()
    m.policy_reloaded("applied")
    m.policy_reloaded("rejected")
    m.api_keys_reloaded("applied")
    m.audit_sink_failed("redis:bastion:audit")
    m.set_limiter_redis_up(True)
    m.policy_denied("no-writes")
    m.upstream_health("files", "up", previous="down")
    m.catalogue_refreshed("files", "ok")
    m.catalogue_refreshed("github", "failed")


def test_every_series_is_exposed_with_its_type() -> None:
    m = Metrics()
    _exercise(m)
    body, _ = m.render()
    families = {f.name: f.type for f in text_string_to_metric_families(body.decode())}
    for name, kind in EXPECTED.items():
        assert families.get(name) == kind, name


def test_values_after_a_few_events() -> None:
    m = Metrics()
    _exercise(m)
    s = _scrape(m)
    assert s[("bastion_tool_calls_total", frozenset({("tool", "files__read"), ("upstream", "files"),
                                                     ("decision", "allow"), ("stage", "complete")}))] == 1
    assert s[("bastion_tool_calls_total", frozenset({("tool", "files__read"), ("upstream", "files"),
                                                     ("decision", "deny"), ("stage", "policy")}))] == 1
    assert s[("bastion_upstream_latency_seconds_count", frozenset({("upstream", "files")}))] == 1
    assert s[("bastion_call_overhead_seconds_count", frozenset())] == 2
    # 0.3 ms overhead for the allowed call and 0.2 ms for the denied one: both under the 0.5 ms bucket.
    assert s[("bastion_call_overhead_seconds_bucket", frozenset({("le", "0.0005")}))] == 2
    assert s[("bastion_call_overhead_seconds_bucket", frozenset({("le", "0.0001")}))] == 0
    assert s[("bastion_ratelimit_rejections_total", frozenset({("limit", "per-principal")}))] == 1
    assert s[("bastion_validation_actions_total", frozenset({("direction", "input"), ("action", "rejected")}))] == 1
    assert s[("bastion_sanitize_actions_total", frozenset({("class", "aws_key")}))] == 2
    assert ("bastion_sanitize_actions_total", frozenset({("class", "email")})) not in s
    assert s[("bastion_upstream_up", frozenset({("upstream", "files")}))] == 1
    assert s[("bastion_upstream_up", frozenset({("upstream", "github")}))] == 0
    assert s[("bastion_catalogue_tools", frozenset())] == 42
    assert s[("bastion_active_sessions", frozenset())] == 1
    assert s[("bastion_policy_reloads_total", frozenset({("outcome", "rejected")}))] == 1
    assert s[("bastion_audit_sink_failures_total", frozenset({("sink", "redis:bastion:audit")}))] == 1
    assert s[("bastion_limiter_redis_up", frozenset())] == 1


def test_two_instances_do_not_share_state() -> None:
    a, b = Metrics(), Metrics()
    a.set_catalogue_tools(5)
    assert _scrape(b)[("bastion_catalogue_tools", frozenset())] == 0


def test_label_values_are_capped_with_an_other_bucket() -> None:
    m = Metrics(max_label_values=3)
    for i in range(10):
        m.observe_call(tool=f"t{i}", upstream="u", decision="allow", stage="complete", total_s=0.001,
                       upstream_s=0.0005)
    tools = {dict(labels)["tool"]: v for (name, labels), v in _scrape(m).items()
             if name == "bastion_tool_calls_total"}
    assert tools == {"t0": 1, "t1": 1, "t2": 1, "other": 7}


def test_label_cap_keeps_known_values_and_truncates_long_ones() -> None:
    cap = LabelCap(2)
    assert [cap("tool", v) for v in ["a", "b", "c", "a", "b"]] == ["a", "b", "other", "a", "b"]
    assert cap("other-label", "x" * 500) == "x" * 128
    assert cap("stage", None) == ""


def test_openmetrics_on_request() -> None:
    m = Metrics()
    body, content_type = m.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_overhead_buckets_resolve_sub_millisecond() -> None:
    assert sum(1 for b in OVERHEAD_BUCKETS if b < 0.001) >= 4


def test_stray_upstream_responses_are_counted_by_upstream_and_reason() -> None:
    m = Metrics()
    m.upstream_stray_response("files", "wrong_stream")
    m.upstream_stray_response("files", "wrong_stream")
    m.upstream_stray_response("files", "late")
    s = _scrape(m)
    assert s[("bastion_upstream_stray_responses_total",
              frozenset({("upstream", "files"), ("reason", "wrong_stream")}))] == 2
    assert s[("bastion_upstream_stray_responses_total", frozenset({("upstream", "files"), ("reason", "late")}))] == 1


def test_upstream_health_sets_one_state_counts_transitions_and_restarts() -> None:
    m = Metrics()
    m.upstream_health("notes", "down")  # declared at start: no transition counted
    m.upstream_health("notes", "up", previous="down")
    m.upstream_health("notes", "restarting", previous="up")
    s = _scrape(m)
    states = {state: s[("bastion_upstream_state", frozenset({("upstream", "notes"), ("state", state)}))]
              for state in ("up", "degraded", "down", "restarting")}
    assert states == {"up": 0, "degraded": 0, "down": 0, "restarting": 1}
    assert s[("bastion_upstream_up", frozenset({("upstream", "notes")}))] == 0
    assert s[("bastion_upstream_transitions_total", frozenset({("upstream", "notes"), ("state", "up")}))] == 1
    assert s[("bastion_upstream_transitions_total", frozenset({("upstream", "notes"), ("state", "restarting")}))] == 1
    assert ("bastion_upstream_transitions_total", frozenset({("upstream", "notes"), ("state", "down")})) not in s
    assert s[("bastion_upstream_restarts_total", frozenset({("upstream", "notes")}))] == 1
    m.upstream_health("notes", "degraded", previous="restarting")
    assert _scrape(m)[("bastion_upstream_up", frozenset({("upstream", "notes")}))] == 1


def test_a_fresh_metrics_object_exports_no_redis_series() -> None:
    # An in-memory gateway never calls the Redis setters: neither gauge may read 0 and fire a Redis alert.
    names = {name for name, _ in _scrape(Metrics())}
    assert not {n for n in names if "redis" in n}


def test_per_tool_latency_histogram_is_capped_on_its_own() -> None:
    m = Metrics(max_label_values=50, histogram_tools=2)
    for i in range(5):
        m.observe_call(tool=f"t{i}", upstream="u", decision="allow", stage="complete", total_s=0.02,
                       upstream_s=0.01)
    s = _scrape(m)
    counts = {dict(labels)["tool"]: v for (name, labels), v in s.items()
              if name == "bastion_tool_call_duration_seconds_count"}
    assert counts == {"t0": 1, "t1": 1, "other": 3}
    # The counter keeps its own, larger cap.
    assert len({dict(labels)["tool"] for (name, labels) in s if name == "bastion_tool_calls_total"}) == 5
    assert s[("bastion_tool_call_duration_seconds_bucket",
              frozenset({("tool", "t0"), ("upstream", "u"), ("le", "0.025")}))] == 1
    assert s[("bastion_tool_call_duration_seconds_bucket",
              frozenset({("tool", "t0"), ("upstream", "u"), ("le", "0.01")}))] == 0


def test_catalogue_refresh_outcomes_and_sessions_started() -> None:
    m = Metrics()
    m.catalogue_refreshed("files", "ok")
    m.catalogue_refreshed("files", "ok")
    m.catalogue_refreshed("files", "error")
    m.session_opened()
    m.session_started()
    m.session_closed()
    s = _scrape(m)
    assert s[("bastion_catalogue_refreshes_total", frozenset({("upstream", "files"), ("outcome", "ok")}))] == 2
    assert s[("bastion_catalogue_refreshes_total", frozenset({("upstream", "files"), ("outcome", "error")}))] == 1
    assert s[("bastion_sessions_started_total", frozenset())] == 1
    assert s[("bastion_active_sessions", frozenset())] == 0


def test_repeated_calls_update_the_same_series_and_caps_still_fold_new_tools() -> None:
    m = Metrics(max_label_values=2, histogram_tools=1)
    for _ in range(3):
        m.observe_call(tool="a", upstream="up", decision="allow", stage="complete", total_s=0.002, upstream_s=0.001)
    m.observe_call(tool="b", upstream="up", decision="allow", stage="complete", total_s=0.002, upstream_s=0.001)
    for _ in range(2):  # past the tool cap (a, b): folded into "other", then served from the kept series
        m.observe_call(tool="c", upstream="up", decision="allow", stage="complete", total_s=0.002, upstream_s=None)
    samples = _scrape(m)

    def calls(tool: str) -> float:
        labels = frozenset({"tool": tool, "upstream": "up", "decision": "allow", "stage": "complete"}.items())
        return samples[("bastion_tool_calls_total", labels)]

    assert (calls("a"), calls("b"), calls("other")) == (3.0, 1.0, 2.0)
    # The duration histogram has its own, smaller tool cap: only "a" gets a series of its own.
    durations = {dict(labels)["tool"]: value for (name, labels), value in samples.items()
                 if name == "bastion_tool_call_duration_seconds_count"}
    assert durations == {"a": 3.0, "other": 3.0}
    assert samples[("bastion_upstream_latency_seconds_count", frozenset({("upstream", "up")}))] == 4.0


def test_upstream_latency_series_appears_only_once_an_upstream_answered() -> None:
    m = Metrics()
    m.observe_call(tool="t", upstream="files", decision="deny", stage="policy", total_s=0.001, upstream_s=None)
    m.observe_call(tool="t", upstream="files", decision="deny", stage="policy", total_s=0.001, upstream_s=None)
    assert not any(name.startswith("bastion_upstream_latency") for name, _ in _scrape(m))
    m.observe_call(tool="t", upstream="files", decision="allow", stage="complete", total_s=0.002, upstream_s=0.001)
    assert _scrape(m)[("bastion_upstream_latency_seconds_count", frozenset({("upstream", "files")}))] == 1.0


def test_policy_reload_failing_is_a_state_that_holds_until_the_files_load_again() -> None:
    m = Metrics()
    failing = ("bastion_policy_reload_failing", frozenset())
    assert _scrape(m)[failing] == 0
    m.policy_reloaded("rejected")
    assert _scrape(m)[failing] == 1
    m.policy_reloaded("unchanged")  # the files read as the policy in force again
    assert _scrape(m)[failing] == 0
    m.policy_reloaded("rejected")
    m.policy_reloaded("applied")
    assert _scrape(m)[failing] == 0


def test_api_keys_reload_failing_is_a_state_that_holds_until_the_key_file_loads_again() -> None:
    m = Metrics()
    failing = ("bastion_api_keys_reload_failing", frozenset())
    assert _scrape(m)[failing] == 0
    m.api_keys_reloaded("rejected")
    assert _scrape(m)[failing] == 1
    m.api_keys_reloaded("unchanged")  # the file reads as the table in force again
    assert _scrape(m)[failing] == 0
    m.api_keys_reloaded("rejected")
    m.api_keys_reloaded("applied")
    assert _scrape(m)[failing] == 0
    assert _scrape(m)[("bastion_api_keys_reloads_total", frozenset({("outcome", "rejected")}))] == 2
