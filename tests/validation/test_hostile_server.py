"""The hostile fixture server starts, lists its tools over stdio with the official SDK client, records calls, and
bastion quarantines exactly the tools it declares hostile."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client

from bastion.tool_entry import ToolEntry
from bastion.validation import SchemaLimits, compile_catalogue
from tests.fixtures.hostile_server import QUARANTINED, TOOLS, USABLE

ROOT = Path(__file__).resolve().parents[2]


async def test_hostile_server_lists_tools_and_records_calls(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    params = StdioServerParameters(command=sys.executable, cwd=ROOT,
                                   args=["-m", "tests.fixtures.hostile_server", "--transport", "stdio",
                                         "--record", str(record)])
    with (tmp_path / "stderr.log").open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
            result = await session.call_tool("rich", {"path": "/tmp/x", "mode": "read"})

    tools = [tool.model_dump(by_alias=True, exclude_none=True) for tool in listed.tools]
    assert tools == TOOLS
    assert result.structured_content == {"count": 3}
    assert [json.loads(line) for line in record.read_text().splitlines()] == [
        {"name": "rich", "arguments": {"path": "/tmp/x", "mode": "read"}}]

    # The schemas survive the wire unchanged, and bastion quarantines exactly the hostile ones.
    entries = [_entry(tool) for tool in tools]
    compiled, quarantined = compile_catalogue(entries, SchemaLimits())
    assert set(quarantined) == {f"hostile__{name}" for name in QUARANTINED}
    assert set(compiled) == {f"hostile__{name}" for name in USABLE}


def _entry(tool: dict[str, Any]) -> ToolEntry:
    public = {**tool, "name": f"hostile__{tool['name']}"}
    return ToolEntry(public_name=public["name"], upstream="hostile", original_name=tool["name"], definition=public,
                     upstream_definition=tool)
