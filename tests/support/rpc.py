"""A deliberately plain JSON-RPC-over-HTTP client for tests that need exact control of headers and bodies."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import orjson

ACCEPT = "application/json, text/event-stream"


def parse_body(response: httpx.Response) -> list[dict[str, Any]]:
    """Every JSON-RPC message in a response, whether it came as JSON or as an SSE stream."""
    ctype = response.headers.get("content-type", "")
    if ctype.startswith("text/event-stream"):
        out = []
        for block in response.text.split("\n\n"):
            data = "\n".join(line[5:].lstrip() for line in block.splitlines() if line.startswith("data:"))
            if data:
                out.append(orjson.loads(data))
        return out
    if not response.content:
        return []
    body = orjson.loads(response.content)
    return body if isinstance(body, list) else [body]


class RpcClient:
    def __init__(self, url: str, headers: dict[str, str] | None = None, version: str = "2025-11-25", *,
                 first_id: int = 1) -> None:
        """``first_id``: where this client's request ids start; clients sharing one session at once need ids
        apart (a session's requests in flight must not share an id)."""
        self.url = url
        self.headers = {"Accept": ACCEPT, **(headers or {})}
        self.version = version
        self.session_id: str | None = None
        self._ids = itertools.count(first_id)
        self.http = httpx.Client(timeout=30.0)

    def close(self) -> None:
        self.http.close()

    def post(self, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        hdrs = dict(self.headers)
        if self.session_id:
            hdrs["Mcp-Session-Id"] = self.session_id
            hdrs["MCP-Protocol-Version"] = self.version
        hdrs.update(headers or {})
        return self.http.post(self.url, content=orjson.dumps(body),
                              headers={"Content-Type": "application/json", **hdrs})

    def initialize(self, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                       "params": {"protocolVersion": self.version, "capabilities": capabilities or {},
                                  "clientInfo": {"name": "rpc-test", "version": "1"}}})
        r.raise_for_status()
        self.session_id = r.headers["mcp-session-id"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return parse_body(r)[0]["result"]

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The final JSON-RPC response (result or error) of one request."""
        rid = next(self._ids)
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            body["params"] = params
        r = self.post(body)
        messages = [m for m in parse_body(r) if m.get("id") == rid]
        assert messages, f"no response to {method}: HTTP {r.status_code} {r.text[:300]}"
        return messages[-1]

    def tool_names(self) -> list[str]:
        return [t["name"] for t in self.request("tools/list")["result"]["tools"]]

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.request("tools/call", {"name": name, "arguments": arguments or {}})
