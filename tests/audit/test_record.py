from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.audit.record import (
    SCHEMA_VERSION,
    arguments_digest,
    as_outcome,
    auth_failure_record,
    call_record,
    canonical_json,
    classify_outcome,
    pin_approve_record,
    pin_drift_record,
    policy_reload_record,
    rfc3339,
    session_record,
    tools_list_record,
)
from bastion.call import CallRecord
from bastion.errors import (
    AuditUnavailable,
    LimiterUnavailable,
    RateLimited,
    ToolError,
    UnknownTool,
    UpstreamRpcError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.principal import Principal
from tests.audit.helpers import TRACEPARENT, assert_valid, context

T0 = 1_767_225_600.123456  # 2026-01-01T00:00:00.123Z
OK_RESULT = {"content": [{"type": "text", "text": "hello"}, {"type": "image", "data": "AAAA", "mimeType": "x/y"}],
             "structuredContent": {"n": 1}}


def _case(stage: str, error: BaseException | None, result: dict[str, Any] | None = None,
          **facts: Any) -> tuple[CallRecord, BaseException | None, dict[str, Any] | None]:
    rec = CallRecord(stage=stage, **facts)
    return rec, error, result


CASES: dict[str, tuple[CallRecord, BaseException | None, dict[str, Any] | None]] = {
    "allowed": _case("complete", None, OK_RESULT, upstream_ms=12.5),
    "denied": _case("policy", UnknownTool("files__read"), None, rule_id="deny-prod-writes", reason="rule denied",
                    shadow=["audit-only-rule"]),
    "rate_limited": _case("ratelimit", RateLimited("per-principal", 1500), None, limit="per-principal"),
    "limiter_unavailable": _case("ratelimit", LimiterUnavailable(), None),
    "invalid_input": _case("input_schema", ToolError("path: 'x' is not of type 'integer'"),
                           {"content": [{"type": "text", "text": "bad"}], "isError": True},
                           violations=["/path: 'x' is not of type 'integer'"]),
    "invalid_output": _case("output_schema", ToolError("withheld"), None, upstream_ms=3.0,
                            violations=["/n: required"]),
    "upstream_error": _case("forward", UpstreamRpcError(-32000, "boom"), None, upstream_ms=4.0),
    "malformed_result": _case("result_shape", None, {"content": [{"type": "text", "text": "malformed"}],
                                                     "isError": True}, violations=["'content' is missing"]),
    "timeout": _case("forward", UpstreamTimeout("files", 30), None, upstream_ms=30000.0),
    "upstream_unavailable": _case("forward", UpstreamUnavailable("files"), None),
    "sanitized": _case("complete", None, OK_RESULT, upstream_ms=2.0, sanitize={"aws_key": 2, "email": 1}),
    "client_disconnected": _case("forward", asyncio.CancelledError(), None),
    "audit_unavailable": _case("complete", AuditUnavailable(), None),
    "error": _case("forward", RuntimeError("bug"), None),
}
DECISION = {"allowed": "allow", "sanitized": "allow", "denied": "deny", "rate_limited": "deny",
            "limiter_unavailable": "deny", "invalid_input": "deny", "invalid_output": "deny",
            "audit_unavailable": "deny", "upstream_error": "error", "malformed_result": "error", "timeout": "error",
            "upstream_unavailable": "error", "client_disconnected": "error", "error": "error"}


@pytest.mark.parametrize("outcome", sorted(CASES))
def test_every_outcome_builds_a_valid_record(outcome: str) -> None:
    rec, error, result = CASES[outcome]
    doc = call_record(context(), rec, started_at=T0, total_ms=50.0, error=error, result=result,
                      outcome="malformed_result" if outcome == "malformed_result" else None)
    assert_valid(doc)
    assert doc["outcome"] == outcome
    assert doc["decision"] == DECISION[outcome]
    assert doc["stage"] == rec.stage
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["event"] == "tool.call"
    assert doc["time"] == "2026-01-01T00:00:00.123Z"
    assert doc["tool"] == {"name": "files__read", "upstream": "files", "original": "read"}
    assert doc["principal"] == {"id": "alice", "groups": ["admins", "eng"], "auth_method": "jwt"}
    assert doc["client"] == {"name": "claude", "version": "1.2"}
    assert (doc["request_id"], doc["call_id"], doc["session"], doc["era"]) == ("req-1", "call-1", "sess-1", "modern")
    assert doc["violations"] == rec.violations
    if error is not None and outcome != "error":
        assert doc["error"]["type"] == type(error).__name__


def test_denied_record_carries_rule_reason_and_shadow_denies() -> None:
    rec, error, _ = CASES["denied"]
    doc = call_record(context(), rec, started_at=T0, total_ms=1.0, error=error)
    assert (doc["rule_id"], doc["reason"], doc["shadow_denies"]) == ("deny-prod-writes", "rule denied",
                                                                    ["audit-only-rule"])
    assert doc["result"] is None
    assert doc["latency_ms"] == {"total": 1.0, "upstream": None, "overhead": 1.0}


def test_rate_limited_record_names_the_limit_and_code() -> None:
    rec, error, _ = CASES["rate_limited"]
    doc = call_record(context(), rec, started_at=T0, total_ms=1.0, error=error)
    assert doc["limit"] == "per-principal"
    assert doc["error"] == {"type": "RateLimited", "plane": "protocol", "code": -31001,
                            "message": "Rate limit exceeded (per-principal); retry after 1500 ms"}
    assert doc["reason"] == doc["error"]["message"]


def test_result_summary_and_latencies() -> None:
    rec, _, result = CASES["sanitized"]
    doc = call_record(context(), rec, started_at=T0, total_ms=10.0, result=result)
    assert doc["result"] == {"is_error": False, "content_types": ["image", "text"], "content_items": 2,
                             "bytes": len(json.dumps(result, separators=(",", ":"))), "structured": True}
    assert doc["sanitize"] == {"aws_key": 2, "email": 1}
    assert doc["latency_ms"] == {"total": 10.0, "upstream": 2.0, "overhead": 8.0}


def test_pipeline_outcome_names_are_accepted_and_allowed_with_redactions_becomes_sanitized() -> None:
    rec = CallRecord(stage="complete", sanitize={"email": 3})
    assert call_record(context(), rec, started_at=T0, total_ms=1, outcome="allowed")["outcome"] == "sanitized"
    assert as_outcome("timeout") == "timeout"
    assert as_outcome("something-new") == "error"


def test_overhead_never_negative() -> None:
    doc = call_record(context(), CallRecord(stage="complete", upstream_ms=12.0), started_at=T0, total_ms=11.0)
    assert doc["latency_ms"]["overhead"] == 0.0


def test_no_context_uses_explicit_fields() -> None:
    doc = call_record(None, None, started_at=T0, total_ms=0.5, error=UnknownTool("nope"), request_id="7",
                      session=None, era="legacy", principal=Principal.anonymous(), public_tool="nope",
                      arguments={"a": 1})
    assert_valid(doc)
    assert doc["outcome"] == "denied"
    assert doc["tool"] == {"name": "nope", "upstream": None, "original": None}
    assert doc["client"] is None
    assert doc["trace"] is None


@pytest.mark.parametrize(("header", "expected"), [
    (TRACEPARENT, {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7", "sampled": True}),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
     {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7", "sampled": False}),
    # A future version may append fields; version 00 may not.
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
     {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7", "sampled": True}),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", None),
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None),
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", None),
    ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", None),
    ("garbage", None),
    ("", None),
    (None, None),
])
def test_traceparent(header: str | None, expected: dict[str, Any] | None) -> None:
    doc = call_record(context(traceparent=header), CallRecord(stage="complete"), started_at=T0, total_ms=1)
    assert doc["trace"] == expected
    assert_valid(doc)


def test_digest_is_stable_across_key_order_and_sensitive_to_values() -> None:
    a = arguments_digest({"b": [1, {"y": 2, "x": "é"}], "a": None})
    b = arguments_digest({"a": None, "b": [1, {"x": "é", "y": 2}]})
    assert a == b
    assert a.startswith("sha256:")
    assert len(a) == len("sha256:") + 64
    assert a != arguments_digest({"a": None, "b": [1, {"x": "e", "y": 2}]})
    # A known value pins the canonical form (sorted keys, no whitespace, UTF-8) across versions.
    assert arguments_digest({"b": 1, "a": "x"}) == (
        "sha256:" + __import__("hashlib").sha256(b'{"a":"x","b":1}').hexdigest())
    assert arguments_digest(None) == arguments_digest({})


def test_no_secret_leaks_when_argument_logging_is_off() -> None:
    token = "ghp_Z9x8SecretTokenValue1234567890abcd"
    ctx = context({"query": "list repos", "auth": {"token": token}, "note": f"Bearer {token}"})
    doc = call_record(ctx, CallRecord(stage="complete"), started_at=T0, total_ms=1, result=OK_RESULT)
    text = json.dumps(doc)
    assert token not in text
    assert "Z9x8" not in text
    assert "arguments" not in doc
    assert "alice@example.com" not in text  # principal attributes (claims) never appear
    assert "free text" not in text  # only name/version of clientInfo
    assert "hello" not in text  # result content is summarized, never copied


def test_logged_arguments_are_redacted_and_secret_keys_masked() -> None:
    ctx = context({"query": "mail bob@example.com", "password": "hunter2", "nested": {"api_key": "k-123"},
                   "items": ["bob@example.com", 3, True, None]})
    doc = call_record(ctx, CallRecord(stage="complete"), started_at=T0, total_ms=1, log_arguments=True,
                      redact=lambda s: s.replace("bob@example.com", "[EMAIL]"))
    assert_valid(doc)
    assert doc["arguments"] == {"query": "mail [EMAIL]", "password": "[REDACTED]",
                                "nested": {"api_key": "[REDACTED]"}, "items": ["[EMAIL]", 3, True, None]}
    text = json.dumps(doc)
    assert "hunter2" not in text
    assert "k-123" not in text
    assert "bob@" not in text


def test_long_values_are_truncated() -> None:
    ctx = context({"blob": "x" * 10_000})
    doc = call_record(ctx, CallRecord(stage="complete", violations=["v" * 10_000]), started_at=T0, total_ms=1,
                      log_arguments=True, request_id="r" * 1000)
    assert_valid(doc)
    assert len(doc["arguments"]["blob"]) == 4096
    assert len(doc["request_id"]) == 256


def test_classify_outcome_without_error() -> None:
    assert classify_outcome(CallRecord(stage="complete"), None) == "allowed"
    assert classify_outcome(CallRecord(stage="complete", sanitize={"x": 0}), None) == "allowed"
    assert classify_outcome(None, ConnectionResetError()) == "client_disconnected"


def test_other_event_builders_validate() -> None:
    alice = Principal(id="alice", groups=frozenset({"eng"}), auth_method="api_key")
    docs = [
        tools_list_record(at=T0, shown=12, hidden=3, request_id="1", session="s", era="legacy", principal=alice,
                          client_info={"name": "c", "version": "1"}, upstreams_failed=["b", "a"]),
        session_record("session.start", at=T0, session="s", era="legacy", principal=alice,
                       client_info={"name": "c"}, protocol_version="2025-06-18"),
        session_record("session.end", at=T0, session="s", era="legacy", principal=alice, reason="deleted",
                       duration_ms=1234.5),
        policy_reload_record(at=T0, outcome="applied", source="/etc/bastion/policy.yaml", digest="sha256:ab",
                             rules=7),
        policy_reload_record(at=T0, outcome="rejected", source="/etc/bastion/policy.yaml",
                             error="policy.yaml:3 [rules[0].effect]: must be allow or deny"),
        pin_drift_record(at=T0, upstream="files", tool="read", pinned="sha256:aa", observed="sha256:bb",
                         action="blocked"),
        pin_approve_record(at=T0, upstream="files", tool="read", fingerprint="sha256:bb", approved_by="ops"),
        auth_failure_record(at=T0, reason="expired", method="jwt", remote_addr="10.0.0.7", key_id="kid-1"),
    ]
    for doc in docs:
        assert_valid(doc)
        assert doc["schema_version"] == 1
        assert doc["kind"] == "audit"
    assert docs[0]["upstreams_failed"] == ["a", "b"]
    assert (docs[0]["shown"], docs[0]["hidden"]) == (12, 3)
    assert [d["event"] for d in docs] == ["tools.list", "session.start", "session.end", "policy.reload",
                                          "policy.reload", "pin.drift", "pin.approve", "auth.failure"]


def test_schema_rejects_unknown_fields_and_wrong_events() -> None:
    from tests.audit.helpers import schema_validator

    doc = call_record(context(), CallRecord(stage="complete"), started_at=T0, total_ms=1)
    assert not list(schema_validator().iter_errors(doc))
    assert list(schema_validator().iter_errors({**doc, "token": "x"}))
    assert list(schema_validator().iter_errors({**doc, "event": "tools.list"}))
    assert list(schema_validator().iter_errors({**doc, "schema_version": 2}))


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(T0) == "2026-01-01T00:00:00.123Z"
    # Rounded to the microsecond first, as datetime does: 0.9999996 s is the next second.
    assert rfc3339(1767225599.9999996) == "2026-01-01T00:00:00.000Z"


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.floats(min_value=-1e9, max_value=4e9, allow_nan=False),
                 st.builds(lambda s, us: s + us / 1e6, st.integers(0, 4_000_000_000), st.integers(0, 999_999)),
                 st.builds(lambda s, half: s + (half + 0.5) / 1e6, st.integers(0, 4_000_000_000),
                           st.integers(0, 999_999))))
def test_rfc3339_says_what_datetime_says(epoch: float) -> None:
    # The per-second memo must not change a single character against the plain datetime formatting.
    expected = datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert rfc3339(epoch) == expected


def test_result_bytes_are_the_canonical_encodings_length_whatever_the_key_order() -> None:
    result = {"structuredContent": {"z": 1, "a": [True, None, 1.5]}, "content": [{"type": "text", "text": "é"}],
              "isError": False}
    doc = call_record(context(), CallRecord(stage="complete"), started_at=T0, total_ms=1, result=result)
    assert doc["result"]["bytes"] == len(canonical_json(result))
    # What orjson refuses still gets a size: the canonical fallback's (here an integer past 64 bits).
    huge = {"content": [], "structuredContent": {"n": 2**80}}
    doc = call_record(context(), CallRecord(stage="complete"), started_at=T0, total_ms=1, result=huge)
    assert doc["result"]["bytes"] == len(canonical_json(huge)) == len(b'{"content":[],"structuredContent":{"n":'
                                                                    + str(2**80).encode() + b"}}")


def test_definition_finding_and_catalogue_drop_records_validate() -> None:
    from bastion.audit.record import catalogue_drop_record, definition_finding_record

    finding = definition_finding_record(at=T0, upstream="notes", item_kind="tool", item="search",
                                        finding="directive_tag", action="neutralised",
                                        fields=["description", "description", "inputSchema.properties.q.title"],
                                        count=2)
    drop = catalogue_drop_record(at=T0, upstream="notes", item_kind="prompt", item="p",
                                 reason="definition blocked by the sanitizer: invisible_characters",
                                 action="dropped")
    for doc in (finding, drop):
        assert_valid(doc)
    assert (finding["event"], finding["class"], finding["fields"]) == \
        ("definition.finding", "directive_tag", ["description", "inputSchema.properties.q.title"])
    assert drop["event"] == "catalogue.drop"
    with pytest.raises(AssertionError):  # the schema refuses an action it does not know
        assert_valid({**finding, "action": "ignored"})
