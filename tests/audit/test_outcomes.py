"""Each error says what a call it stops counts as; the pipeline passes that word to the audit hook and the span.

The table is the one the runner used to keep by guard name: a guard's own error at its own stage must still give
the outcome and decision it gave then, and an error that says nothing counts by where it stopped the call.
"""

from __future__ import annotations

from contextlib import AsyncExitStack, suppress
from typing import Any

import pytest

from bastion.approvals.guard import NotApproved
from bastion.call import CallContext, CallRecord, Outcome
from bastion.errors import (
    INTERNAL_ERROR,
    CatalogueChanging,
    LimiterUnavailable,
    PolicyDenied,
    ProtocolError,
    RateLimited,
    RequestError,
    ToolError,
    UnknownTool,
    UpstreamRpcError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.pipeline import Pipeline
from bastion.sanitize.guard import ResultWithheld
from bastion.sanitize.shape import MalformedResult
from bastion.validation.guards import InvalidArguments, OutputRejected
from tests.audit.helpers import context


class Raising:
    """A request or response guard of a given name that stops every call with a given error."""

    def __init__(self, name: str, error: RequestError) -> None:
        self.name = name
        self.error = error

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None:
        raise self.error

    async def apply(self, ctx: CallContext, result: dict[str, Any], record: CallRecord) -> dict[str, Any]:
        raise self.error


class Audited:
    """An audit hook that keeps what the pipeline hands it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Outcome, str, dict[str, Any] | None]] = []

    async def __call__(self, ctx: CallContext, record: CallRecord, outcome: Outcome, result: dict[str, Any] | None,
                       total_ms: float, *, error: BaseException | None = None) -> None:
        self.calls.append((outcome, record.decision, result))


async def ok(ctx: CallContext, record: CallRecord) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "ok"}]}


async def run(pipeline: Pipeline, forward: Any = ok) -> None:
    with suppress(RequestError):  # the error's plane is not what these tests are about
        await pipeline.run(context(), forward)


REQUEST_STOPS = [
    ("quarantine", UnknownTool("files__read"), "denied", "deny"),
    ("policy", UnknownTool("files__read"), "denied", "deny"),
    ("policy", PolicyDenied("files__read", "no-writes", None), "denied", "deny"),
    ("approval", NotApproved("declined"), "denied", "deny"),
    ("ratelimit", RateLimited("per-principal", 1000), "rate_limited", "deny"),
    ("ratelimit", LimiterUnavailable(), "rate_limited", "deny"),
    ("input_schema", InvalidArguments("bad arguments"), "invalid_input", "deny"),
    ("refresh_gate", CatalogueChanging("files", "files__read"), "error", "error"),
    ("some_new_guard", ToolError("says nothing"), "error", "error"),
]


@pytest.mark.parametrize(("stage", "error", "outcome", "decision"), REQUEST_STOPS)
async def test_a_request_guard_error_gives_its_outcome(stage: str, error: RequestError, outcome: str,
                                                       decision: str) -> None:
    audited = Audited()
    await run(Pipeline([Raising(stage, error)], [], audited))
    assert [(o, d) for o, d, _ in audited.calls] == [(outcome, decision)]


RESPONSE_STOPS = [
    ("result_shape", MalformedResult("malformed"), "malformed_result", "error"),
    ("output_schema", OutputRejected("withheld"), "invalid_output", "error"),
    ("sanitize", ResultWithheld("withheld"), "denied", "deny"),
]


@pytest.mark.parametrize(("stage", "error", "outcome", "decision"), RESPONSE_STOPS)
async def test_a_response_guard_error_gives_its_outcome(stage: str, error: RequestError, outcome: str,
                                                        decision: str) -> None:
    audited = Audited()
    await run(Pipeline([], [Raising(stage, error)], audited))
    ((got, got_decision, result),) = audited.calls
    assert (got, got_decision) == (outcome, decision)
    assert result is not None and result["isError"] is True  # a tool error is the call's answer


FORWARD_STOPS = [
    (UpstreamUnavailable("files"), "upstream_error"),
    (UpstreamRpcError(-32000, "boom"), "upstream_error"),
    (UpstreamTimeout("files", 1.0), "timeout"),
    # Errors that say nothing: the forward's are the upstream's.
    (ProtocolError(INTERNAL_ERROR, "malformed answer"), "upstream_error"),
    (ToolError("the upstream asked for input too often"), "upstream_error"),
]


@pytest.mark.parametrize(("error", "outcome"), FORWARD_STOPS)
async def test_a_forward_error_gives_its_outcome(error: RequestError, outcome: str) -> None:
    async def failing(ctx: CallContext, record: CallRecord) -> dict[str, Any]:
        raise error

    audited = Audited()
    await run(Pipeline([], [], audited), failing)
    assert [(o, d) for o, d, _ in audited.calls] == [(outcome, "error")]
