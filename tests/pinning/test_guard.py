from __future__ import annotations

from collections.abc import Mapping, Set
from contextlib import AsyncExitStack

import pytest

from bastion.errors import UnknownTool
from bastion.pinning import PinGuard
from bastion.pipeline import CallContext, CallRecord
from bastion.principal import Principal
from bastion.tool import ToolEntry
from tests.pinning.tools import read_file


def call(upstream: str = "files", name: str = "read_file") -> CallContext:
    tool = ToolEntry(public_name=f"{upstream}__{name}", upstream=upstream, original_name=name,
                     definition=read_file(), upstream_definition=read_file())
    return CallContext(request_id="1", principal=Principal.anonymous(), tool=tool, arguments={"path": "/x"})


async def test_quarantined_tool_is_refused_as_unknown() -> None:
    snapshot: dict[str, Set[str]] = {"files": frozenset({"read_file"})}
    guard = PinGuard(lambda: snapshot)
    assert guard.name == "pinning"
    record = CallRecord()
    async with AsyncExitStack() as cleanup:
        with pytest.raises(UnknownTool) as info:
            await guard.check(call(), record, cleanup)
    assert info.value.message == "Unknown tool: files__read_file"
    assert info.value.to_error() == UnknownTool("files__read_file").to_error()
    assert (record.stage, record.decision, record.reason) == ("pinning", "deny",
                                                              "tool quarantined: definition changed")


async def test_other_tools_pass_and_the_snapshot_is_read_per_call() -> None:
    snapshot: dict[str, Set[str]] = {"files": frozenset({"list_dir"})}

    def current() -> Mapping[str, Set[str]]:
        return snapshot

    guard = PinGuard(current)
    async with AsyncExitStack() as cleanup:
        record = CallRecord()
        await guard.check(call(), record, cleanup)
        await guard.check(call("web"), record, cleanup)
        assert (record.stage, record.decision, record.reason) == ("policy", "allow", None)
        snapshot = {"files": frozenset({"read_file"})}
        with pytest.raises(UnknownTool):
            await guard.check(call(), CallRecord(), cleanup)
