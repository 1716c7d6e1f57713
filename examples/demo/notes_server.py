"""Demo upstream #1 (stdio): a small notes service. bastion starts it as a subprocess.

    python examples/demo/notes_server.py            # speaks MCP on stdin/stdout
"""

from __future__ import annotations

import itertools
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations
from pydantic import Field

mcp = MCPServer("demo-notes", instructions="Keeps short text notes for the current gateway process.")
_notes: dict[int, str] = {1: "bastion fronts many MCP servers behind one endpoint.",
                          2: "Policies live in YAML files and reload without a restart."}
_ids = itertools.count(3)


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
def add_note(text: Annotated[str, Field(max_length=2000, description="The note's text")]) -> dict[str, int]:
    """Store a note and return its id."""
    note_id = next(_ids)
    _notes[note_id] = text
    return {"id": note_id}


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
def list_notes() -> list[dict[str, object]]:
    """List every note with its id."""
    return [{"id": k, "text": v} for k, v in sorted(_notes.items())]


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
def search_notes(query: Annotated[str, Field(min_length=1, description="Case-insensitive substring")]) -> list[int]:
    """Ids of the notes containing the query."""
    return [k for k, v in sorted(_notes.items()) if query.lower() in v.lower()]


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def delete_note(note_id: int) -> str:
    """Delete a note for good."""
    return "deleted" if _notes.pop(note_id, None) is not None else "no such note"


@mcp.resource("note://{note_id}")
def read_note(note_id: str) -> str:
    """One note's text."""
    return _notes.get(int(note_id), "")


@mcp.prompt()
def summarize_notes(style: str = "bullet points") -> str:
    """Ask the model to summarize every note."""
    body = "\n".join(f"- {v}" for _, v in sorted(_notes.items()))
    return f"Summarize these notes as {style}:\n{body}"


if __name__ == "__main__":
    mcp.run("stdio")
