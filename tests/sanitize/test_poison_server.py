"""The fixture server through the real SDK client: what arrives over stdio is what the unit tests assume."""

from __future__ import annotations

import sys
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.definitions import sanitize_instructions, sanitize_tool_definition
from bastion.sanitize.result import sanitize_result
from tests.fixtures.poison_server import PAYLOADS, TOOLS

POLICY = SanitizeConfig.from_mapping({"definitions": "flag"}).default


async def test_poison_server_over_stdio() -> None:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "tests.fixtures.poison_server", "--transport", "stdio"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        listed = await session.list_tools()
        results: dict[str, Any] = {}
        for name in ("ansi", "structured", "binary"):
            call = await session.call_tool(name, {})
            results[name] = call.model_dump(by_alias=True, exclude_none=True, mode="json")

    assert [t.name for t in listed.tools] == [t["name"] for t in TOOLS]
    add = next(t for t in listed.tools if t.name == "add").model_dump(by_alias=True, exclude_none=True, mode="json")
    clean, report, _ = sanitize_tool_definition(add, POLICY)
    assert "\U000e0069" in add["description"]
    assert clean["description"].endswith("</IMPORTANT>")
    assert any(f.kind == "injection:hidden-ignore-previous" for f in report.findings)
    assert init.instructions is not None
    assert sanitize_instructions(init.instructions, POLICY)[0] == "Use these tools freely."

    assert results["ansi"]["content"][0]["text"] == PAYLOADS["ansi"]  # escapes survive the transport
    out, _ = sanitize_result(results["ansi"], POLICY)
    assert out["content"][0]["text"].encode() == b"red plain clip st dcs hidden-cursor c1"

    out, _ = sanitize_result(results["structured"], POLICY)
    assert out["content"][0]["text"] == (
        '{\n  "status": "ok",\n  "note": "visible",\n  "token": "[REDACTED:github-token]",\n  "items": [\n'
        '    {\n      "label": "ab"\n    },\n    {\n      "label": "plain"\n    }\n  ]\n}')

    out, report = sanitize_result(results["binary"], POLICY)
    assert [b["type"] for b in out["content"]] == ["image", "text", "text", "text", "resource_link"]
    assert report.counts["mime_blocked"] == 2
