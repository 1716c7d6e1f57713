from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from bastion.tool_entry import ToolEntry
from bastion.validation import SchemaLimits, compile_catalogue


def tool(name: str, input_schema: Any) -> ToolEntry:
    definition = {"name": name, "inputSchema": input_schema}
    return ToolEntry(public_name=f"up__{name}", upstream="up", original_name=name,
                     definition={**definition, "name": f"up__{name}"}, upstream_definition=definition)


class Counts:
    def __init__(self) -> None:
        self.quarantines: list[tuple[str, str]] = []

    def validated(self, *args: Any) -> None:
        return None

    def quarantined(self, upstream: str, tool: str) -> None:
        self.quarantines.append((upstream, tool))


def test_compiles_good_tools_and_quarantines_hostile_ones() -> None:
    counts = Counts()
    entries = [tool("ok", {"type": "object"}), tool("remote", {"$ref": "https://evil.example/s.json"}),
               tool("broken", {"type": 5})]
    with capture_logs() as logs:
        compiled, quarantined = compile_catalogue(entries, SchemaLimits(), metrics=counts)
    assert set(compiled) == {"up__ok"}
    assert set(quarantined) == {"up__remote", "up__broken"}
    assert "not local" in quarantined["up__remote"]
    assert counts.quarantines == [("up", "remote"), ("up", "broken")]
    assert [(log["event"], log["upstream"], log["tool"]) for log in logs] == [
        ("validation.tool_quarantined", "up", "remote"), ("validation.tool_quarantined", "up", "broken")]
    assert all(log["log_level"] == "warning" and log["reason"] for log in logs)
