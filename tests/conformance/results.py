"""Read the conformance harness's per-scenario ``checks.json`` files and compare two runs. No I/O beyond reading.

The harness (``-o DIR``) writes ``DIR/server-<scenario>-<ISO timestamp>/checks.json``: a list of checks, each with
an ``id``, a ``name``, a ``status`` (SUCCESS, FAILURE, WARNING, INFO) and, when not SUCCESS, an ``errorMessage``.
Check ids repeat inside a scenario (one ``incoming-sse-event`` per event), so runs are compared by how many
SUCCESS checks each id has.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_DIR_RE = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")
# One line per scenario printed by .ci/conformance.sh: "PASS name  1 passed, 0 failed, 0 warnings -- note"
_SUMMARY_RE = re.compile(r"^(?:PASS|FAIL) (?P<scenario>\S+) ")


@dataclass(frozen=True, slots=True)
class Check:
    id: str
    name: str
    status: str
    message: str


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    checks: tuple[Check, ...]

    def successes(self) -> Counter[str]:
        return Counter(c.id for c in self.checks if c.status == "SUCCESS")

    @property
    def clean(self) -> bool:
        """The harness's own baseline rule: a scenario passes when no check is FAILURE or WARNING."""
        return not any(c.status in ("FAILURE", "WARNING") for c in self.checks)


def load_results(out_dir: Path) -> dict[str, Scenario]:
    """Scenario name -> its checks; a scenario run twice keeps the latest run (timestamps sort)."""
    found: dict[str, Scenario] = {}
    for path in sorted(out_dir.glob("server-*/checks.json")):
        match = _DIR_RE.match(path.parent.name)
        if match is None:
            continue
        raw = json.loads(path.read_text())
        checks = tuple(Check(id=str(c.get("id", "")), name=str(c.get("name", "")), status=str(c.get("status", "")),
                             message=_message(c)) for c in raw)
        found[match["scenario"]] = Scenario(match["scenario"], checks)
    return found


def _message(check: Mapping[str, Any]) -> str:
    # INFO checks (a part of a scenario judged not applicable) explain themselves in details.message instead.
    details = check.get("details")
    note = details.get("message") if isinstance(details, Mapping) else None
    # Messages can be pretty-printed validation errors; one line keeps the per-scenario diff readable.
    return " ".join(str(check.get("errorMessage") or note or "").split())


def parse_summary(stdout: str) -> dict[str, str]:
    """Scenario name -> the script's one-line verdict (carries TIMEOUT and crash notes checks.json cannot)."""
    lines: dict[str, str] = {}
    for line in stdout.splitlines():
        match = _SUMMARY_RE.match(line)
        if match:
            lines[match["scenario"]] = line.strip()
    return lines


def regressions(direct: Mapping[str, Scenario], through: Mapping[str, Scenario],
                summary: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """Per scenario, each check that succeeded directly but not through the gateway, with the gateway's verdict."""
    summary = summary or {}
    out: dict[str, list[str]] = {}
    for name in sorted(direct):
        wanted = direct[name].successes()
        if not wanted:
            continue
        other = through.get(name)
        if other is None:
            out[name] = [f"no checks.json through the gateway ({summary.get(name, 'harness did not report')})"]
            continue
        got = other.successes()
        lines = []
        for check_id, count in sorted(wanted.items()):
            if got[check_id] >= count:
                continue
            seen = [c for c in other.checks if c.id == check_id and c.status != "SUCCESS"]
            verdict = "; ".join(f"{c.status}: {c.message or '(no message)'}" for c in seen) or "check missing"
            lines.append(f"{check_id}: {got[check_id]}/{count} SUCCESS -- {verdict}")
        if lines:
            # Checks the scenario added only through the gateway (e.g. a catch-all *-error check) explain why.
            extra = [f"{c.id}: {c.status}: {c.message}" for c in other.checks
                     if c.status == "FAILURE" and c.id not in wanted]
            out[name] = lines + extra
    return out


def format_regressions(found: Mapping[str, list[str]]) -> str:
    parts = []
    for name, lines in found.items():
        parts.append(f"  {name}:")
        parts.extend(f"    - {line}" for line in lines)
    return "\n".join(parts)


def unclean(results: Mapping[str, Scenario]) -> set[str]:
    return {name for name, scenario in results.items() if not scenario.clean}


def load_baseline(path: Path) -> set[str]:
    """The server scenarios of a harness ``--expected-failures`` YAML file."""
    doc = yaml.safe_load(path.read_text()) or {}
    return {str(name) for name in doc.get("server", [])}
