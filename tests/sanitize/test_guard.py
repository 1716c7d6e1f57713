from __future__ import annotations

from collections.abc import Mapping

import pytest

from bastion.call import CallContext, CallRecord
from bastion.errors import ToolError
from bastion.principal import Principal
from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.guard import ResultWithheld, SanitizeGuard
from tests.fixtures.poison_server import result_for


def ctx(upstream: str = "poison", tool: str = "secrets") -> CallContext:
    from bastion.tool_entry import ToolEntry

    entry = ToolEntry(public_name=f"{upstream}__{tool}", upstream=upstream, original_name=tool,
                      definition={"name": tool}, upstream_definition={"name": tool})
    return CallContext(request_id="1", principal=Principal.anonymous(), tool=entry, arguments={})


async def test_guard_fills_record_and_calls_hook() -> None:
    seen: list[tuple[str, str, dict[str, int]]] = []

    def hook(upstream: str, tool: str, counts: Mapping[str, int]) -> None:
        seen.append((upstream, tool, dict(counts)))

    guard = SanitizeGuard(SanitizeConfig.from_mapping({}), on_counts=hook)
    record = CallRecord()
    out = await guard.apply(ctx(), result_for("secrets", {}), record)
    assert guard.name == "sanitize"
    assert "[REDACTED:github-token]" in out["content"][0]["text"]
    assert record.sanitize["secret:github-token"] == 1
    assert seen == [("poison", "secrets", record.sanitize)]


async def test_guard_blocks_injection_as_a_tool_error() -> None:
    guard = SanitizeGuard(SanitizeConfig.from_mapping({"upstreams": {"poison": {"injection": "block"}}}))
    record = CallRecord()
    with pytest.raises(ResultWithheld) as info:
        await guard.apply(ctx(tool="inject"), result_for("inject", {}), record)
    assert isinstance(info.value, ToolError)
    assert info.value.to_result() == {"content": [{"type": "text", "text": "result withheld: possible prompt "
                                                   "injection"}], "isError": True}
    assert record.sanitize["injection:ignore-previous"] == 1


async def test_guard_disabled_per_tool_passes_result_through() -> None:
    cfg = SanitizeConfig.from_mapping({"upstreams": {"poison": {"tools": {"secrets": {"enabled": False}}}}})
    result = result_for("secrets", {})
    record = CallRecord()
    assert await SanitizeGuard(cfg).apply(ctx(), result, record) is result
    assert record.sanitize == {}
