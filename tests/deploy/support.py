"""Small readers for the deployment files: Dockerfile instructions, .dockerignore rules, multi-document YAML."""

from __future__ import annotations

import fnmatch
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).resolve().parent / "schemas"


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    args: str

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form instruction (raises if it is in shell form)."""
        text = self.args
        for flag in ("--interval", "--timeout", "--start-period", "--retries"):
            while text.startswith(flag):
                text = text.split(None, 1)[1]
        if text.startswith("CMD "):
            text = text[4:]
        value = json.loads(text)
        assert isinstance(value, list), f"{self.keyword} is not in exec form: {self.args}"
        return value


def dockerfile(path: Path = ROOT / "Dockerfile") -> list[Instruction]:
    """Instructions in order, continuation lines joined and comments dropped, numbered by build stage."""
    logical: list[str] = []
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not current):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    out: list[Instruction] = []
    stage = -1
    for line in logical:
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword.upper(), args.strip()))
    return out


def copy_sources(instr: Instruction) -> list[str]:
    parts = [p for p in shlex.split(instr.args) if not p.startswith("--")]
    return parts[:-1]


def dockerignore_excludes(rel_path: str, path: Path = ROOT / ".dockerignore") -> bool:
    """True when the build context would leave ``rel_path`` out (last matching rule wins, ``!`` re-includes).

    A rule matching a parent directory matches everything below it, as in Docker's implementation.
    """
    rules = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    parts = rel_path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        pattern = pattern.strip("/")
        hit = any(fnmatch.fnmatchcase(c, pattern) or
                  (pattern.startswith("**/") and fnmatch.fnmatchcase(c.split("/")[-1], pattern[3:]))
                  for c in candidates)
        if hit:
            excluded = not negate
    return excluded


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def load_json(name: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((SCHEMAS / name).read_text())
    return value
