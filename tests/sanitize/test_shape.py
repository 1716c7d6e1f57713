"""The result-shape guard: malformed results become well-formed errors; content blocks are bounded."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.call import CallContext, CallRecord
from bastion.pipeline import Pipeline
from bastion.principal import Principal
from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.shape import MalformedResult, ResultShapeGuard, cap_blocks, omitted_marker, result_problem
from bastion.tool_entry import ToolEntry

OK = {"content": [{"type": "text", "text": "ok"}]}


@pytest.mark.parametrize(("result", "problem"), [
    ([], "the result is a list, not an object"),
    ({"content": []}, None),
    ({"content": [], "isError": False, "structuredContent": {}, "_meta": {}}, None),
    ({}, "'content' is missing"),
    ({"content": "text"}, "'content' is a string, not a list"),
    ({"content": [], "isError": "true"}, "'isError' is a string, not a boolean"),
    ({"content": [], "isError": 1}, "'isError' is a number, not a boolean"),
    ({"content": [], "structuredContent": None}, "'structuredContent' is null, not an object"),
    ({"content": [], "_meta": []}, "'_meta' is a list, not an object"),
    ({"content": ["x"]}, "content[0] is a string, not an object"),
    ({"content": [{"type": "video"}]}, 'content[0] has an unknown type ("video")'),
    ({"content": [{"type": "Video<script>"}]}, "content[0] has an unknown type (unrecognised)"),
    ({"content": [{"text": "x"}]}, "content[0] has an unknown type (unrecognised)"),
    ({"content": [{"type": "text", "text": 3}]}, "content[0] (text) has no string 'text'"),
    ({"content": [{"type": "image", "data": "AA=="}]}, "content[0] (image) has no string 'mimeType'"),
    ({"content": [{"type": "resource_link", "uri": "u://x"}]}, "content[0] (resource_link) has no string 'name'"),
    ({"content": [{"type": "resource", "resource": {"uri": "u://x"}}]},
     "content[0] (resource) has neither a string 'text' nor a string 'blob'"),
    ({"content": [{"type": "resource", "resource": "u://x"}]},
     "content[0] (resource) has no resource object with a string 'uri'"),
    ({"content": [{"type": "text", "text": "x", "annotations": []}]},
     "content[0].annotations is a list, not an object"),
])
def test_result_problem(result: Any, problem: str | None) -> None:
    assert result_problem(result) == problem


def test_modern_clients_may_get_any_structured_content() -> None:
    assert result_problem({"content": [], "structuredContent": [1, 2]}, structured_object=False) is None


def test_cap_blocks() -> None:
    result = {"content": [{"type": "text", "text": "x"}] * 10, "isError": False}
    capped, omitted = cap_blocks(result, 4)
    assert omitted == 6 and len(capped["content"]) == 5 and capped["content"][-1] == omitted_marker(6, 4)
    assert capped["isError"] is False
    assert cap_blocks(result, 10) == (result, 0)


def ctx(era: Any = "legacy") -> CallContext:
    entry = ToolEntry(public_name="u__t", upstream="u", original_name="t", definition={"name": "u__t"},
                      upstream_definition={"name": "t"})
    return CallContext(request_id="1", principal=Principal.anonymous(), tool=entry, arguments={}, era=era)


async def test_guard_caps_then_checks() -> None:
    guard = ResultShapeGuard(SanitizeConfig.from_mapping({"max_content_blocks": 3}))
    record = CallRecord()
    out = await guard.apply(ctx(), {"content": [{"type": "text", "text": "x"}] * 5}, record)
    assert len(out["content"]) == 4 and record.sanitize == {"content_blocks_omitted": 2}
    with pytest.raises(MalformedResult, match="'isError' is a string"):
        await guard.apply(ctx(), {"content": [], "isError": "no"}, CallRecord())
    assert await guard.apply(ctx("modern"), {"content": [], "structuredContent": [1]}, CallRecord())


async def test_pipeline_turns_a_malformed_result_into_an_error_result_and_audits_it() -> None:
    seen: list[tuple[str, CallRecord, dict[str, Any] | None]] = []

    async def audit(ctx: CallContext, record: CallRecord, outcome: str, result: dict[str, Any] | None,
                    total_ms: float, *, error: BaseException | None = None) -> None:
        seen.append((outcome, record, result))

    async def forward(ctx: CallContext, record: CallRecord) -> dict[str, Any]:
        return {"content": {"type": "text", "text": "hi"}}

    pipeline = Pipeline([], [ResultShapeGuard(SanitizeConfig.from_mapping(None))], audit)
    result = await pipeline.run(ctx(), forward)
    assert result == {"isError": True, "content": [
        {"type": "text", "text": "The upstream returned a malformed result: 'content' is an object, not a list"}]}
    outcome, record, _ = seen[0]
    assert outcome == "malformed_result" and record.decision == "error"
    assert record.violations == ["'content' is an object, not a list"]
