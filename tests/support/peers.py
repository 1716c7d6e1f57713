"""Public MCP peers the tests run against, installed once into a reusable cache directory.

``$PEERS_DIR`` (default ``/tmp/peers``) keeps npm packages and extra virtualenvs between runs on one machine; a
fresh machine installs them on first use. A peer that cannot be installed fails the test with the installer's
output: these tests are about interoperability, and skipping them would hide exactly what they exist to show.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EVERYTHING = "@modelcontextprotocol/server-everything"
MCP1_SPEC = "mcp>=1.25,<2"


def peers_dir() -> Path:
    return Path(os.environ.get("PEERS_DIR", "/tmp/peers"))


def everything_bin() -> Path:
    root = peers_dir() / "everything"
    binary = root / "node_modules" / ".bin" / "mcp-server-everything"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is required to install the reference MCP server (server-everything); install Node.js")
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "package.json").exists():
        (root / "package.json").write_text('{"private": true}\n')
    done = subprocess.run([npm, "install", "--no-audit", "--no-fund", EVERYTHING], cwd=root, capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0 or not binary.exists():
        pytest.fail(f"could not npm install {EVERYTHING} into {root}:\n{done.stderr[-2000:]}")
    return binary


def mcp1_python() -> Path:
    """A virtualenv with the 1.x line of the official SDK, to test bastion against the clients still deployed."""
    venv = peers_dir() / "mcp1-venv"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", MCP1_SPEC], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"could not install {MCP1_SPEC} into {venv}:\n{done.stderr[-2000:]}")
    marker.write_text(MCP1_SPEC)
    return python
