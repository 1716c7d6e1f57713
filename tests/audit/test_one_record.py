"""Exactly one audit record per tools/call, whatever the input and whatever fails: property-based.

Three layers, fastest first: the record builder on arbitrary values (it must be total), the pipeline with guards,
forward and response guards that fail in every way (one record each time, schema-valid, encodable), and the front
door with arbitrary JSON arguments (tests/server/test_one_record_per_call.py, and the e2e run in
tests/e2e/test_audit_properties.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.audit.hook import CallAuditor
from bastion.audit.log import AuditLog
from bastion.audit.record import arguments_digest, call_record, canonical_json
from bastion.call import CallContext, CallRecord
from bastion.errors import (
    RateLimited,
    ToolError,
    UnknownTool,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.pipeline import Pipeline
from bastion.strictjson import printable
from tests.audit.helpers import assert_valid, context

T0 = 1_767_225_600.0


class Opaque:
    def __repr__(self) -> str:
        return "Opaque(\ud800)"


def nested(depth: int, leaf: Any) -> Any:
    for i in range(depth):
        leaf = [leaf] if i % 2 else {"k": leaf}
    return leaf


TEXT = st.text(st.characters(codec=None), max_size=12)  # includes lone surrogates
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**60, max_value=2**200)
           | st.floats() | TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4)
                   | st.dictionaries(st.integers(), inner, max_size=2) | st.tuples(inner)
                   | st.builds(nested, st.integers(1, 400), inner)),
    max_leaves=20) | st.just(Opaque())
ARGUMENTS = st.dictionaries(TEXT, VALUES, max_size=5)


def _canonical_orjson(value: Any) -> bytes | None:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
                            default=lambda v: printable(repr(v)))
    except (TypeError, ValueError):
        return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=ARGUMENTS, result=st.none() | st.dictionaries(TEXT, VALUES, max_size=3),
       log_arguments=st.booleans(), redactor_fails=st.booleans())
def test_the_record_builder_is_total(arguments: dict[str, Any], result: dict[str, Any] | None,
                                     log_arguments: bool, redactor_fails: bool) -> None:
    def redact(text: str) -> str:
        if redactor_fails:
            raise ValueError("redactor bug")
        return text.replace("secret", "[x]")

    doc = call_record(context(arguments), CallRecord(stage="forward"), started_at=T0, total_ms=1.0,
                      result=result, log_arguments=log_arguments, redact=redact)
    encoded = orjson.dumps(doc)  # every sink serializes with orjson: it must never refuse a record
    assert_valid(orjson.loads(encoded))
    standard = _canonical_orjson(arguments)
    if standard is not None:
        # Where orjson can encode the arguments the digest is the documented one, and nothing is flagged.
        assert doc["arguments_digest"] == "sha256:" + hashlib.sha256(standard).hexdigest()
        assert "audit_error" not in doc
    else:
        assert doc["arguments_digest"] == arguments_digest(arguments)
        assert doc["audit_error"].startswith("arguments_digest:")


def test_the_fallback_canonical_form_is_json_where_json_can_say_it() -> None:
    value = {"b": [1, 2**70, "\ud800", 1.5, None, True], "a": nested(300, {"z": "é"}), 3: "x"}
    text = canonical_json(value).decode()  # orjson refuses it (too deep, 70-bit integer, lone surrogate)
    assert text.startswith('{"3":"x","a":[{"k":[{"k":')
    assert text.endswith(',"b":[1,1180591620717411303424,"\\ud800",1.5,null,true]}')
    assert json.loads(text) == {"3": "x", "a": nested(300, {"z": "é"}), "b": [1, 2**70, "\ud800", 1.5, None, True]}
    assert canonical_json({"a": 1}) == b'{"a":1}'
    assert arguments_digest({"b": 1, "a": 2}) == arguments_digest({"a": 2, "b": 1})


# -- the pipeline -------------------------------------------------------------------------------------------

class MemorySink:
    """A real sink (the ``AuditSink`` protocol) that keeps records in memory."""

    name = "memory"

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def write(self, record: dict[str, Any]) -> None:
        self.records.append(orjson.loads(orjson.dumps(record)))

    async def close(self) -> None:
        return None


FAILURES: dict[str, Any] = {
    "tool_error": lambda: ToolError("the model can read this"),
    "unknown_tool": lambda: UnknownTool("x"),
    "rate_limited": lambda: RateLimited("burst", 100),
    "timeout": lambda: UpstreamTimeout("files", 1.0),
    "unavailable": lambda: UpstreamUnavailable("files"),
    "bug": lambda: KeyError("a guard bug"),
    "foreign": lambda: OSError("an untranslated foreign error"),
    "recursion": lambda: RecursionError("maximum recursion depth exceeded"),
}
BEHAVIOUR = st.sampled_from([None, None, None, *FAILURES])


@dataclass
class Guard:
    name: str
    fail: str | None

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None:
        record.rule_id = "r1"
        if self.fail:
            raise FAILURES[self.fail]()

    async def apply(self, ctx: CallContext, result: dict[str, Any], record: CallRecord) -> dict[str, Any]:
        if self.fail:
            raise FAILURES[self.fail]()
        return {**result, "seen_by": self.name}


@settings(max_examples=150, deadline=None)
@given(arguments=ARGUMENTS, request_fails=st.lists(BEHAVIOUR, max_size=3),
       forward_does=st.sampled_from(["result", "not_a_dict", "is_error", *FAILURES]),
       response_fails=st.lists(BEHAVIOUR, max_size=2), client_id=st.none() | st.integers() | TEXT)
def test_the_pipeline_writes_exactly_one_record(arguments: dict[str, Any], request_fails: list[str | None],
                                                 forward_does: str, response_fails: list[str | None],
                                                 client_id: Any) -> None:
    sink = MemorySink()
    pipeline = Pipeline([Guard(f"g{i}", f) for i, f in enumerate(request_fails)],
                        [Guard(f"r{i}", f) for i, f in enumerate(response_fails)],
                        CallAuditor(AuditLog([sink]), clock=lambda: T0))

    async def forward(ctx: CallContext, record: CallRecord) -> dict[str, Any]:
        if forward_does == "result":
            return {"content": [{"type": "text", "text": "ok"}]}
        if forward_does == "is_error":
            return {"content": [], "isError": True}
        if forward_does == "not_a_dict":
            return ["not", "a", "result"]  # type: ignore[return-value]
        raise FAILURES[forward_does]()

    ctx = context(arguments)._replace(client_id=client_id)
    outcome: Any
    try:
        outcome = asyncio.run(pipeline.run(ctx, forward))
    except Exception as exc:
        outcome = exc
    if isinstance(outcome, Exception):  # what the client is answered with: a bastion error, never a foreign one
        assert type(outcome).__module__ == "bastion.errors", repr(outcome)
    assert len(sink.records) == 1, sink.records
    [doc] = sink.records
    assert_valid(doc)
    assert doc["call_id"] == ctx.request_id
    assert doc["decision"] == ("allow" if isinstance(outcome, dict) and doc["outcome"] == "allowed" else
                               doc["decision"])
    if isinstance(outcome, dict):
        assert doc["result"] is not None
    else:
        assert doc["decision"] in ("deny", "error")
        assert doc["result"] is None
    unexpected = {"bug", "foreign", "recursion"}
    if any(f in unexpected for f in request_fails[:1]) or (not any(request_fails) and forward_does in unexpected):
        assert doc["outcome"] == "error"
        assert "audit_error" in doc


async def test_a_cancelled_call_is_recorded_once() -> None:
    sink = MemorySink()
    pipeline = Pipeline([], [], CallAuditor(AuditLog([sink]), clock=lambda: T0))
    started = asyncio.Event()

    async def forward(ctx: CallContext, record: CallRecord) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(60)
        return {}

    task = asyncio.create_task(pipeline.run(context({"deep": nested(300, 1)}), forward))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [doc] = sink.records
    assert (doc["outcome"], doc["stage"]) == ("client_disconnected", "forward")
    assert_valid(doc)
