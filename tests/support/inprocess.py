"""bastion in this process: the real app (``create_app``) behind httpx's ASGI transport, with a real upstream.

No socket between the test and the front door, so hundreds of requests cost milliseconds each; the upstream is
the stdio fixture server as a real subprocess, and audit records go to a real file sink the test reads back.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bastion.app import create_app
from bastion.settings import loads
from tests.support.gateway import REPO

ACCEPT = "application/json, text/event-stream"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {}}


@dataclass
class FrontDoor:
    client: httpx.AsyncClient
    audit_path: Path
    app: Any = None  # the Starlette application behind the client

    async def post(self, body: bytes | Any, headers: dict[str, str] | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await self.client.post("/mcp", content=content, headers={
            "Accept": ACCEPT, "Content-Type": "application/json", **(headers or {})})

    async def session(self, version: str = "2025-11-25") -> dict[str, str]:
        """Open a legacy session; the headers later requests of it carry."""
        r = await self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert r.status_code == 200, r.text
        headers = {"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": version}
        await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
        return headers

    def records(self, event: str | None = "tool.call") -> list[dict[str, Any]]:
        if not self.audit_path.exists():
            return []
        docs = [json.loads(line) for line in self.audit_path.read_bytes().splitlines() if line.strip()]
        return [d for d in docs if event is None or d.get("event") == event]


@contextlib.asynccontextmanager
async def front_door(workdir: Path, **config: Any) -> AsyncIterator[FrontDoor]:
    """The gateway in front of ``tests.fixtures.basic_server`` (prefix ``basic``) over stdio."""
    audit = workdir / "audit.jsonl"
    doc = {
        "auth": "none",
        "listen": {"host": "127.0.0.1", "port": 8080, **config.pop("listen", {})},
        "upstreams": {"basic": {"command": [sys.executable, "-m", "tests.fixtures.basic_server", "--transport",
                                            "stdio"], "cwd": str(REPO), "era": "legacy"}},
        "audit": {"sinks": [{"file": str(audit)}]},
        **config,
    }
    app = create_app(loads(yaml.safe_dump(doc), base_dir=workdir))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080", timeout=30) as client:
            yield FrontDoor(client, audit, app)
