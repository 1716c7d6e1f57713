"""Reading the Markdown tables the benchmark scripts print."""

from __future__ import annotations


def tables(stdout: str) -> list[list[list[str]]]:
    """Every Markdown table of the output, as rows of cells (header row first, the separator left out)."""
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*stdout.splitlines(), ""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            found.append(current)
            current = []
    return found
