"""Demo upstream #2 (Streamable HTTP): a few utility tools on its own port.

    python examples/demo/tools_server.py --port 8091   # serves http://127.0.0.1:8091/mcp
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

mcp = MCPServer("demo-tools", instructions="Utility tools: time, unit conversion and text statistics.")


class WordCount(BaseModel):
    words: int
    characters: int
    lines: int


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False))
def utc_now() -> str:
    """The current UTC time in ISO 8601."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False))
def convert_length(value: float, unit: Literal["km", "mi"]) -> float:
    """Convert a length between kilometres and miles."""
    return round(value / 1.609344, 6) if unit == "km" else round(value * 1.609344, 6)


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False))
def word_count(text: Annotated[str, Field(max_length=100_000)]) -> WordCount:
    """Count words, characters and lines of a text."""
    return WordCount(words=len(text.split()), characters=len(text), lines=text.count("\n") + 1 if text else 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8091)
    args = parser.parse_args()
    mcp.run("streamable-http", host=args.host, port=args.port)
