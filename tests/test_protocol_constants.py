"""Protocol constants are defined once, in ``bastion.protocol``: no other module spells a version or a reserved
``_meta`` key, so the server and upstream sides cannot drift apart."""

from __future__ import annotations

import ast
from pathlib import Path

import bastion
from bastion.protocol import versions

SRC = Path(bastion.__file__).parent
VERSIONS = {*versions.HANDSHAKE_VERSIONS, *versions.MODERN_VERSIONS}


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants in code, docstrings and other bare expression statements left out."""
    bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare]


def test_versions_and_meta_keys_are_spelled_only_in_the_protocol_package() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name == "protocol" and path.parent.parent == SRC:
            continue
        for line, text in _literals(ast.parse(path.read_text(), str(path))):
            if text in VERSIONS or text.startswith("io.modelcontextprotocol/"):
                found.append(f"{path.relative_to(SRC)}:{line}: {text!r}")
    assert found == []


def test_the_scan_sees_the_protocol_package_itself() -> None:
    # The test above must be able to fail: the definitions it looks for are where it expects them.
    text = (SRC / "protocol" / "meta.py").read_text()
    assert {value for _, value in _literals(ast.parse(text))} >= {"io.modelcontextprotocol/protocolVersion"}


def test_supported_versions_are_listed_newest_first() -> None:
    assert tuple(sorted(VERSIONS, reverse=True)) == versions.SUPPORTED_VERSIONS
    assert max(versions.HANDSHAKE_VERSIONS) == versions.LATEST_HANDSHAKE
