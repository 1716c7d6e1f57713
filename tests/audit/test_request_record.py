"""The ``request`` record: how a forwarded request other than tools/call ended, in the words of a ``tool.call``
record, valid against the published schema for every end it can have."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import orjson
import pytest

from bastion.audit.record import REQUEST_STAGES, RequestTarget, request_record
from bastion.errors import (
    AuditUnavailable,
    InvalidParams,
    LimiterUnavailable,
    RateLimited,
    UpstreamRpcError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.principal import Principal
from tests.audit.helpers import TRACEPARENT, assert_valid, schema_validator

ALICE = Principal(id="alice", groups=frozenset({"eng"}), auth_method="api_key")
READ = RequestTarget(uri="files+file:///srv/a", upstream="files", original="file:///srv/a")
PROMPT = RequestTarget(name="docs__intro", upstream="docs", original="intro")


def build(*, method: str = "resources/read", target: RequestTarget = READ, stage: str = "complete",
          error: BaseException | None = None, result: dict[str, Any] | None = None,
          reason: str | None = None, upstream_ms: float | None = 2.0) -> dict[str, Any]:
    doc = request_record(at=0.0, method=method, target=target, stage=stage, total_ms=3.0, upstream_ms=upstream_ms,
                         error=error, result=result, reason=reason, request_id=7, session="s-1", era="legacy",
                         principal=ALICE, client_info={"name": "c", "version": "1"}, traceparent=TRACEPARENT)
    assert_valid(doc)
    return doc


def verdict(doc: dict[str, Any]) -> tuple[Any, ...]:
    return doc["decision"], doc["outcome"], doc["stage"]


def test_an_answered_read_says_how_much_went_back_never_what() -> None:
    result = {"contents": [{"uri": "files+file:///srv/a", "text": "secret text"}]}
    doc = build(result=result)
    assert doc["event"] == "request" and verdict(doc) == ("allow", "allowed", "complete")
    assert doc["target"] == {"name": None, "uri": "files+file:///srv/a", "upstream": "files",
                             "original": "file:///srv/a"}
    encoded = orjson.dumps(result, option=orjson.OPT_SORT_KEYS)
    assert doc["result"] == {"items": 1, "bytes": len(encoded),
                             "digest": "sha256:" + hashlib.sha256(encoded).hexdigest()}
    assert "secret text" not in orjson.dumps(doc).decode()
    assert doc["latency_ms"] == {"total": 3.0, "upstream": 2.0, "overhead": 1.0}
    assert (doc["request_id"], doc["session"], doc["era"], doc["principal"]["id"]) == (7, "s-1", "legacy", "alice")
    assert doc["trace"]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert (doc["limit"], doc["reason"], doc["error"]) == (None, None, None)


@pytest.mark.parametrize(("method", "result", "items"), [
    ("prompts/get", {"messages": [{"role": "user"}, {"role": "assistant"}]}, 2),
    ("completion/complete", {"completion": {"values": ["a", "b", "c"]}}, 3),
    ("resources/subscribe", {}, 0),
])
def test_items_count_what_each_method_returns(method: str, result: dict[str, Any], items: int) -> None:
    assert build(method=method, target=PROMPT, result=result)["result"]["items"] == items


@pytest.mark.parametrize(("error", "stage", "expected"), [
    (InvalidParams("Unknown prompt: x"), "resolve", ("deny", "denied", "resolve")),
    (InvalidParams("resources/read requires a string 'uri'"), "parse", ("deny", "invalid_input", "parse")),
    (RateLimited("reads", 850), "ratelimit", ("deny", "rate_limited", "ratelimit")),
    (LimiterUnavailable(), "ratelimit", ("deny", "limiter_unavailable", "ratelimit")),
    (UpstreamRpcError(-32002, "Resource not found"), "forward", ("error", "upstream_error", "forward")),
    (UpstreamUnavailable("files"), "forward", ("error", "upstream_unavailable", "forward")),
    (UpstreamTimeout("files", 5.0), "forward", ("error", "timeout", "forward")),
    (asyncio.CancelledError(), "forward", ("error", "client_disconnected", "forward")),
    (AuditUnavailable(), "forward", ("deny", "audit_unavailable", "forward")),
    (RuntimeError("bug"), "forward", ("error", "error", "forward")),
])
def test_every_end_is_recorded_in_a_tool_calls_words(error: BaseException, stage: str,
                                                     expected: tuple[str, str, str]) -> None:
    doc = build(error=error, stage=stage, result={"contents": []})
    assert verdict(doc) == expected
    assert doc["result"] is None  # nothing went back
    assert doc["error"]["type"] == type(error).__name__


def test_a_refusal_keeps_the_limit_and_the_message_the_client_got() -> None:
    doc = build(error=RateLimited("reads", 850), stage="ratelimit", upstream_ms=None)
    assert doc["limit"] == "reads"
    assert doc["error"] == {"type": "RateLimited", "plane": "protocol", "code": -31001,
                            "message": "Rate limit exceeded (reads); retry after 850 ms"}
    assert doc["reason"] == doc["error"]["message"]
    assert doc["latency_ms"]["upstream"] is None


def test_a_hidden_target_is_told_apart_for_operators_only() -> None:
    hidden = RequestTarget(name="docs__secret")
    doc = build(method="prompts/get", target=hidden, stage="resolve", error=InvalidParams("Unknown prompt: x"),
                reason="prompt not visible to the caller", upstream_ms=None)
    assert doc["reason"] == "prompt not visible to the caller"
    assert doc["error"]["message"] == "Unknown prompt: x"  # what the client saw, the same as for an unknown one
    assert doc["target"] == {"name": "docs__secret", "uri": None, "upstream": None, "original": None}


def test_long_and_unencodable_targets_are_capped() -> None:
    doc = build(target=RequestTarget(uri="x://" + "a" * 1000 + "\ud800"), stage="resolve",
                error=InvalidParams("Resource not found"))
    assert len(doc["target"]["uri"]) == 256 and doc["target"]["uri"].endswith("…")
    orjson.dumps(doc)


def test_the_schema_names_the_same_stages_and_refuses_a_tool_call() -> None:
    request = schema_validator().schema["$defs"]["request"]["properties"]
    assert request["stage"]["enum"] == list(REQUEST_STAGES)
    doc = request_record(at=0.0, method="tools/call", target=PROMPT, stage="complete", total_ms=0.0,
                         upstream_ms=None, error=None, result={}, reason=None, request_id=None, session=None,
                         era=None, principal=None)
    with pytest.raises(AssertionError):
        assert_valid(doc)


def test_a_request_let_through_uncounted_is_marked_as_a_call_is() -> None:
    doc = request_record(at=0.0, method="prompts/get", target=PROMPT, stage="complete", total_ms=3.0,
                         upstream_ms=2.0, error=None, result={"messages": []}, reason=None, request_id=7,
                         session=None, era="modern", principal=ALICE, ratelimit_degraded=True)
    assert_valid(doc)
    assert doc["ratelimit_degraded"] is True
    assert "ratelimit_degraded" not in build()  # present only when true, as in a tool.call record


def test_what_the_caller_typed_passes_the_redactor_and_a_failing_one_masks_it() -> None:
    target = RequestTarget(uri="files+file:///k/SECRET", upstream="files", original="file:///k/SECRET")
    error = InvalidParams("Resource not found: files+file:///k/SECRET")
    doc = request_record(at=0.0, method="resources/read", target=target, stage="resolve", total_ms=1.0,
                         upstream_ms=None, error=error, result=None, reason=None, request_id=1, session=None,
                         era="modern", principal=ALICE, redact=lambda text: text.replace("SECRET", "[R]"))
    assert_valid(doc)
    assert (doc["target"]["uri"], doc["target"]["original"]) == ("files+file:///k/[R]", "file:///k/[R]")
    assert doc["target"]["upstream"] == "files"  # a configured name, not typed by the caller
    assert doc["error"]["message"] == doc["reason"] == "Resource not found: files+file:///k/[R]"

    def broken(text: str) -> str:
        raise RuntimeError("redactor bug")

    doc = request_record(at=0.0, method="resources/read", target=target, stage="resolve", total_ms=1.0,
                         upstream_ms=None, error=error, result=None, reason=None, request_id=1, session=None,
                         era="modern", principal=ALICE, redact=broken)
    assert_valid(doc)
    assert "SECRET" not in orjson.dumps(doc).decode()


def test_a_lone_surrogate_is_made_encodable_before_the_redactor_reads_it() -> None:
    """The secret rules read text: a lone surrogate the caller sent is replaced first, so the rest of the URI is
    still recorded (and redacted), not masked whole for a redactor that could not encode it."""
    def strict(text: str) -> str:
        text.encode("utf-8")  # as RE2 does: a lone surrogate cannot be encoded
        return text.replace("SECRET", "[R]")

    target = RequestTarget(uri="files+file:///k/\ud800SECRET")
    doc = request_record(at=0.0, method="resources/read", target=target, stage="resolve", total_ms=1.0,
                         upstream_ms=None, error=None, result=None, reason=None, request_id=1, session=None,
                         era="modern", principal=ALICE, redact=strict)
    assert_valid(doc)
    assert doc["target"]["uri"] == "files+file:///k/\ufffd[R]"
