"""The input and output guards with real pipeline objects, in every output mode."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import pytest
from structlog.testing import capture_logs

from bastion.call import CallContext, CallRecord
from bastion.errors import ToolError
from bastion.principal import Principal
from bastion.tool_entry import ToolEntry
from bastion.validation import (
    InputSchemaGuard,
    OutputMode,
    OutputSchemaGuard,
    SchemaLimits,
    ToolValidators,
    ValidationConfig,
    compile_tool,
)
from bastion.validation.metrics import Direction, Outcome

DEFINITION = {
    "name": "search",
    "inputSchema": {"type": "object", "required": ["query"], "additionalProperties": False,
                    "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "maximum": 10}}},
    "outputSchema": {"type": "object", "required": ["hits"],
                     "properties": {"hits": {"type": "array", "items": {"type": "string"}}}},
}
SECRET = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"


class Counts:
    def __init__(self) -> None:
        self.seen: list[tuple[Direction, str, str, Outcome]] = []
        self.quarantines: list[tuple[str, str]] = []

    def validated(self, direction: Direction, upstream: str, tool: str, outcome: Outcome) -> None:
        self.seen.append((direction, upstream, tool, outcome))

    def quarantined(self, upstream: str, tool: str) -> None:
        self.quarantines.append((upstream, tool))


def entry(definition: dict[str, Any] = DEFINITION) -> ToolEntry:
    public = {**definition, "name": "docs__search"}
    return ToolEntry(public_name="docs__search", upstream="docs", original_name="search", definition=public,
                     upstream_definition=definition)


def context(arguments: dict[str, Any], tool: ToolEntry | None = None) -> CallContext:
    return CallContext(request_id="1", principal=Principal(id="alice"), tool=tool or entry(), arguments=arguments)


VALIDATORS = compile_tool(DEFINITION, SchemaLimits())


def lookup(_: ToolEntry) -> ToolValidators | None:
    return VALIDATORS


async def test_valid_arguments_pass() -> None:
    counts = Counts()
    record = CallRecord()
    async with AsyncExitStack() as stack:
        await InputSchemaGuard(lookup, metrics=counts).check(context({"query": "q", "limit": 3}), record, stack)
    assert record.violations == []
    assert counts.seen == [("input", "docs", "search", "pass")]


async def test_invalid_arguments_raise_a_tool_error_a_model_can_act_on() -> None:
    counts = Counts()
    record = CallRecord()
    with capture_logs() as logs:
        async with AsyncExitStack() as stack:
            with pytest.raises(ToolError) as info:
                await InputSchemaGuard(lookup, metrics=counts).check(context({"limit": 99, "token": SECRET}),
                                                                      record, stack)
    message = info.value.message
    assert message == ("Invalid arguments for tool docs__search: $: missing required property 'query'; "
                       "$: unexpected property 'token'; $.limit: must be <= 10")
    assert SECRET not in message
    assert info.value.to_result()["isError"] is True
    assert record.stage == "input_schema"
    assert record.decision == "deny"
    assert record.violations == ["$: missing required property 'query'", "$: unexpected property 'token'",
                                 "$.limit: must be <= 10"]
    assert counts.seen == [("input", "docs", "search", "reject")]
    assert [log["event"] for log in logs] == ["validation.input_rejected"]
    assert SECRET not in repr(logs)


async def test_truncated_listing_says_so() -> None:
    validators = compile_tool({"inputSchema": {"type": "object", "additionalProperties": {"type": "integer"}}},
                              SchemaLimits(max_errors=2))
    record = CallRecord()
    async with AsyncExitStack() as stack:
        with pytest.raises(ToolError, match=r"; \(further violations omitted\)$"):
            await InputSchemaGuard(lambda _: validators).check(context({"a": "x", "b": "x", "c": "x"}), record,
                                                               stack)
    assert len(record.violations) == 2


async def test_tool_without_validators_is_refused() -> None:
    record = CallRecord()
    async with AsyncExitStack() as stack:
        with pytest.raises(ToolError, match="Tool docs__search is unavailable"):
            await InputSchemaGuard(lambda _: None).check(context({"query": "q"}), record, stack)
    assert record.decision == "deny"


def output_guard(mode: OutputMode, counts: Counts | None = None) -> OutputSchemaGuard:
    return OutputSchemaGuard(lookup, lambda _: mode, metrics=counts)


GOOD = {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"hits": ["a"]}}
BAD = {"content": [{"type": "text", "text": SECRET}], "structuredContent": {"hits": [SECRET, 1]}}
MISSING = {"content": [{"type": "text", "text": "no structure"}]}
FAILED = {"content": [{"type": "text", "text": "boom"}], "structuredContent": {"hits": 5}, "isError": True}


@pytest.mark.parametrize("mode", ["strict", "warn", "off"])
async def test_valid_output_passes_untouched(mode: OutputMode) -> None:
    record = CallRecord()
    assert await output_guard(mode).apply(context({}), dict(GOOD), record) == GOOD
    assert record.violations == []


async def test_strict_withholds_violating_output_without_its_data() -> None:
    counts = Counts()
    record = CallRecord()
    with capture_logs() as logs, pytest.raises(ToolError) as info:
        await output_guard("strict", counts).apply(context({}), dict(BAD), record)
    assert info.value.message == ("Tool docs__search returned a result that does not match its output schema; "
                                  "the result was withheld: $.hits[1]: must be of type string")
    assert record.stage == "output_schema"
    assert record.decision == "error"
    assert record.violations == ["$.hits[1]: must be of type string"]
    assert counts.seen == [("output", "docs", "search", "reject")]
    assert [log["event"] for log in logs] == ["validation.output_withheld"]
    assert SECRET not in repr(logs)


async def test_strict_treats_missing_structured_content_as_a_violation() -> None:
    record = CallRecord()
    with pytest.raises(ToolError, match="missing structuredContent"):
        await output_guard("strict").apply(context({}), dict(MISSING), record)
    assert record.violations == ["$: missing structuredContent required by the tool's outputSchema"]


@pytest.mark.parametrize("result", [BAD, MISSING])
async def test_warn_passes_logs_and_counts(result: dict[str, Any]) -> None:
    counts = Counts()
    record = CallRecord()
    with capture_logs() as logs:
        assert await output_guard("warn", counts).apply(context({}), dict(result), record) == result
    assert record.violations
    assert counts.seen == [("output", "docs", "search", "warn")]
    assert logs[0]["event"] == "validation.output_violation"
    assert logs[0]["log_level"] == "warning"


@pytest.mark.parametrize("result", [BAD, MISSING])
async def test_off_skips(result: dict[str, Any]) -> None:
    counts = Counts()
    record = CallRecord()
    assert await output_guard("off", counts).apply(context({}), dict(result), record) == result
    assert record.violations == []
    assert counts.seen == [("output", "docs", "search", "skip")]


@pytest.mark.parametrize("mode", ["strict", "warn"])
async def test_error_results_pass_untouched(mode: OutputMode) -> None:
    record = CallRecord()
    assert await output_guard(mode).apply(context({}), dict(FAILED), record) == FAILED
    assert record.violations == []


async def test_tool_without_output_schema_is_not_checked() -> None:
    definition = {"name": "plain", "inputSchema": {"type": "object"}}
    validators = compile_tool(definition, SchemaLimits())
    guard = OutputSchemaGuard(lambda _: validators, lambda _: "strict")
    record = CallRecord()
    assert await guard.apply(context({}, entry(definition)), dict(MISSING), record) == MISSING


async def test_config_drives_the_output_mode_per_tool() -> None:
    config = ValidationConfig.from_mapping({"output": "strict",
                                            "upstreams": {"docs": {"tools": {"search": "warn"}}}})
    guard = OutputSchemaGuard(lookup, config.mode_for_tool)
    record = CallRecord()
    assert await guard.apply(context({}), dict(BAD), record) == BAD
    assert record.violations == ["$.hits[1]: must be of type string"]
