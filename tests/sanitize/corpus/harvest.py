"""How the ``benign/harvested.jsonl`` part of the corpus was collected (kept for provenance; tests read the JSONL).

    python tests/sanitize/corpus/harvest.py > tests/sanitize/corpus/benign/harvested.jsonl

Real text a tool would return, taken from the machine the corpus was built on: windows of Python source from
installed packages (the MCP SDK among them, which talks about ``role: "user"``/``"assistant"`` throughout),
their README/METADATA descriptions, Debian changelogs and package logs, bastion's own docs (security.md, which
quotes attack strings on purpose, is left out), and real tracebacks raised by the standard library.
"""

from __future__ import annotations

import gzip
import json
import random
import site
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
rng = random.Random(12)


def windows(text: str, lines: int, count: int) -> Iterator[str]:
    rows = text.splitlines()
    if len(rows) <= lines:
        if text.strip():
            yield text
        return
    for _ in range(count):
        start = rng.randrange(0, len(rows) - lines)
        chunk = "\n".join(rows[start:start + lines]).strip()
        if len(chunk) > 200:
            yield chunk


def sources() -> Iterator[tuple[str, str]]:
    packages = Path(site.getsitepackages()[0])
    py_files = sorted(p for pkg in ("mcp", "httpx", "starlette", "click", "jsonschema", "anyio", "uvicorn",
                                    "prometheus_client", "structlog", "redis", "yaml", "jwt", "h11", "pluggy")
                      for p in (packages / pkg).rglob("*.py") if p.stat().st_size > 2000)
    for path in rng.sample(py_files, 60):
        for chunk in windows(path.read_text(errors="replace"), 40, 1):
            yield "code", chunk
    metas = sorted(packages.glob("*.dist-info/METADATA"))
    for path in rng.sample(metas, min(25, len(metas))):
        body = path.read_text(errors="replace").split("\n\n", 1)[-1]
        for chunk in windows(body, 35, 1):
            yield "docs", chunk
    docs = sorted(p for p in Path("/usr/share/doc").glob("*/changelog*.gz"))
    for path in rng.sample(docs, min(15, len(docs))):
        for chunk in windows(gzip.decompress(path.read_bytes()).decode("utf-8", "replace"), 30, 1):
            yield "changelog", chunk
    for log in ("/var/log/dpkg.log", "/var/log/apt/history.log", "/var/log/alternatives.log"):
        if Path(log).exists():
            for chunk in windows(Path(log).read_text(errors="replace"), 25, 5):
                yield "log", chunk
    for path in sorted((REPO / "docs").glob("*.md")):
        if path.name != "security.md":
            for chunk in windows(path.read_text(), 30, 2):
                yield "docs", chunk
    for chunk in tracebacks():
        yield "stacktrace", chunk


def tracebacks() -> Iterator[str]:
    import decimal
    import ipaddress
    import json as js
    import sqlite3
    import urllib.parse
    import zoneinfo

    def nested() -> None:
        def parse(payload: str) -> object:
            return js.loads(payload)
        try:
            parse('{"user": "ana", "roles": ["admin",]}')
        except ValueError as exc:
            raise RuntimeError("could not load the session file /var/lib/app/session.json") from exc

    cases: list[Callable[[], object]] = [
        lambda: js.loads('{"role": "user", "content": "hi"'),
        lambda: ipaddress.ip_address("300.1.2.3"),
        lambda: decimal.Decimal("1.5") / decimal.Decimal(0),
        lambda: sqlite3.connect(":memory:").execute("select * from users where role = 'assistant'"),
        lambda: zoneinfo.ZoneInfo("Mars/Olympus_Mons"),
        lambda: urllib.parse.urlsplit("http://[::1/admin"),
        lambda: {"system": 1}["user"],
        lambda: int("forty-two"),
        lambda: Path("/nonexistent/config/system.yaml").read_text(),
        lambda: [1, 2, 3][7],
        lambda: ["role", " assistant"][3],
        nested,
        lambda: __import__("bastion_missing_plugin"),
        lambda: b"\xff\xfe".decode("utf-8"),
        lambda: sorted([1, "user", None]),
    ]
    for case in cases:
        try:
            case()
        except Exception:
            yield traceback.format_exc().replace(str(Path.home()), "/home/app")


def main() -> None:
    for i, (kind, text) in enumerate(sources()):
        sys.stdout.write(json.dumps({"id": f"harvest-{i:03d}", "kind": kind, "split": ("dev", "test")[i % 2],
                                     "text": text}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
