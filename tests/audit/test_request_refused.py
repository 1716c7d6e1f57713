"""The ``request.refused`` record: a forwarded request other than tools/call that the limiter refused, in the words
of a refused ``tool.call`` record, valid against the published schema."""

from __future__ import annotations

import pytest

from bastion.audit.record import request_refused_record
from bastion.errors import LimiterUnavailable, RateLimited
from bastion.principal import Principal
from tests.audit.helpers import TRACEPARENT, assert_valid

ALICE = Principal(id="alice", groups=frozenset({"eng"}), auth_method="api_key")


def test_a_rate_limited_read_is_recorded_like_a_refused_call() -> None:
    doc = request_refused_record(at=0.0, method="resources/read", name=None, uri="files+file:///srv/a",
                                 upstream="files", error=RateLimited("reads", 850), request_id=7, session="s-1",
                                 era="legacy", principal=ALICE, client_info={"name": "c", "version": "1"},
                                 traceparent=TRACEPARENT)
    assert_valid(doc)
    assert doc["event"] == "request.refused"
    assert (doc["method"], doc["decision"], doc["outcome"], doc["stage"], doc["limit"]) == \
        ("resources/read", "deny", "rate_limited", "ratelimit", "reads")
    assert doc["target"] == {"name": None, "uri": "files+file:///srv/a", "upstream": "files"}
    assert doc["error"] == {"type": "RateLimited", "plane": "protocol", "code": -31001,
                            "message": "Rate limit exceeded (reads); retry after 850 ms"}
    assert doc["reason"] == doc["error"]["message"]
    assert doc["request_id"] == 7 and doc["trace"]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_concurrency_refusal_and_a_fail_closed_limiter() -> None:
    capped = request_refused_record(at=0.0, method="prompts/get", name="docs__intro", uri=None, upstream="docs",
                                    error=RateLimited("inflight", 1000, detail={"kind": "concurrency"}),
                                    request_id="r", session=None, era="modern", principal=ALICE)
    assert_valid(capped)
    assert capped["limit"] == "inflight" and capped["target"]["name"] == "docs__intro"
    closed = request_refused_record(at=0.0, method="completion/complete", name="docs__intro", uri=None,
                                    upstream="docs", error=LimiterUnavailable(), request_id=None, session=None,
                                    era="modern", principal=ALICE)
    assert_valid(closed)
    assert (closed["outcome"], closed["limit"], closed["error"]["code"]) == ("limiter_unavailable", None, -31004)


def test_the_schema_refuses_a_tool_call_under_this_event() -> None:
    doc = request_refused_record(at=0.0, method="tools/call", name="x", uri=None, upstream="u",
                                 error=RateLimited("x", 1), request_id=None, session=None, era=None, principal=None)
    with pytest.raises(AssertionError):
        assert_valid(doc)
