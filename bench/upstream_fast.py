"""A deliberately cheap MCP upstream for benchmarks: one ``echo`` tool over Streamable HTTP (handshake era).

    python bench/upstream_fast.py --port 8091            # serves http://127.0.0.1:8091/mcp
    python bench/upstream_fast.py --port 8091 --impl sdk  # the official SDK server instead, for realism

The default implementation is a hand-written HTTP/1.1 server on ``asyncio.Protocol``: no ASGI framework, no
validation, one JSON answer per POST. It speaks just enough of MCP for bastion and the load generator
(``initialize``, ``notifications/initialized``, ``ping``, ``tools/list``, ``tools/call echo``; GET is 405 so no
notification stream is opened; DELETE is 200). Its cost per call is a few tens of microseconds, so when bastion
sits in front of it, what the benchmark measures is bastion.

``--structured`` gives ``echo`` an ``outputSchema`` and its results a ``structuredContent`` (as the TypeScript
upstream of ``sidebyside.py`` does), so a gateway's output validation has work to do. ``--tools N`` lists N tools
(``echo`` and N-1 generated ones of about 1.3 KB each, half ``*_read`` and half ``*_write``), for
``catalogue_scale.py``. The generated tools are there to be listed; a call to one answers as ``echo`` does.

The ``sdk`` implementation is the ``mcp`` package's ``MCPServer`` with JSON responses; it costs milliseconds of
CPU per call and shows what a real Python upstream adds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

PATH = b"/mcp"
VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
ECHO_TOOL = {
    "name": "echo",
    "description": "Return the given text.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "annotations": {"readOnlyHint": True},
}
ECHO_OUTPUT_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
MAX_HEAD = 64 * 1024
MAX_BODY = 4 * 1024 * 1024


def generated_tool(i: int) -> dict[str, Any]:
    """A realistic, harmless tool definition of about 1.3 KB (as JSON, once prefixed by a gateway).

    Plain prose and an ordinary schema, so that a gateway's definition checks (sanitizing, pinning) do their usual
    work and find nothing to rewrite; the ``_read``/``_write`` suffix lets a policy glob select half of them.
    """
    verb = "read" if i % 2 else "write"
    return {
        "name": f"records_{i:03d}_{verb}",
        "description": (f"{verb.capitalize()} entries of record set {i} in the inventory service. The set holds "
                        "the stock levels, locations and suppliers of one product family; each entry has an id, "
                        "a status and an owner. Results are paged: pass the cursor of the previous answer to go "
                        "on, and a limit to keep answers small."),
        "inputSchema": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "Identifier of the record to act on."},
                "fields": {"type": "array", "items": {"type": "string"},
                           "description": "Fields to include in the answer; all when absent."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "Most entries."},
                "cursor": {"type": "string", "description": "Where the previous page ended."},
                "filter": {"type": "object", "additionalProperties": False, "properties": {
                    "status": {"type": "string", "enum": ["open", "closed", "archived"]},
                    "owner": {"type": "string", "maxLength": 64}}},
            },
            "required": ["id"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "entries": {"type": "array", "items": {"type": "object", "properties": {
                    "id": {"type": "string"}, "status": {"type": "string"}, "owner": {"type": "string"}}}},
                "next_cursor": {"type": "string", "description": "Pass it back to get the next page."},
            },
            "required": ["entries"],
        },
        "annotations": {"title": f"{verb.capitalize()} record set {i}", "readOnlyHint": verb == "read",
                        "idempotentHint": True},
    }


@dataclass(frozen=True)
class Catalogue:
    """What this upstream lists, and whether ``echo`` answers with ``structuredContent``."""

    tools: Sequence[dict[str, Any]]
    structured: bool = False

    @classmethod
    def build(cls, *, tools: int = 1, structured: bool = False) -> Catalogue:
        echo = {**ECHO_TOOL, "outputSchema": ECHO_OUTPUT_SCHEMA} if structured else ECHO_TOOL
        return cls(tools=[echo, *(generated_tool(i) for i in range(1, tools))], structured=structured)


def answer(message: Any, catalogue: Catalogue = Catalogue(tools=[ECHO_TOOL])) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, extra headers) for one JSON-RPC message. Pure: no I/O."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or "method" not in message:
        if isinstance(message, dict) and "id" in message and ("result" in message or "error" in message):
            return 202, b"", {}  # a response to a server request: none are ever sent, ignore
        return 400, orjson.dumps({"jsonrpc": "2.0", "id": None,
                                  "error": {"code": -32600, "message": "Invalid Request"}}), {}
    if "id" not in message:
        return 202, b"", {}
    method = message["method"]
    params = message.get("params") or {}
    headers: dict[str, str] = {}
    result: Any
    if method == "initialize":
        asked = params.get("protocolVersion")
        result = {"protocolVersion": asked if asked in VERSIONS else VERSIONS[1],
                  "capabilities": {"tools": {"listChanged": False}},
                  "serverInfo": {"name": "upstream-fast", "version": "1.0.0"}}
        headers["Mcp-Session-Id"] = secrets.token_hex(16)
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": catalogue.tools}
    elif method == "tools/call" and any(params.get("name") == tool["name"] for tool in catalogue.tools):
        text = str((params.get("arguments") or {}).get("text", ""))
        result = {"content": [{"type": "text", "text": text}], "isError": False}
        if catalogue.structured:
            result["structuredContent"] = {"text": text}
    else:
        return 200, orjson.dumps({"jsonrpc": "2.0", "id": message["id"],
                                  "error": {"code": -32601, "message": f"Method not found: {method}"}}), headers
    return 200, orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), headers


REASONS = {200: b"OK", 202: b"Accepted", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed",
           411: b"Length Required", 413: b"Payload Too Large"}


def http_response(status: int, body: bytes, headers: dict[str, str]) -> bytes:
    head = [b"HTTP/1.1 %d %s" % (status, REASONS.get(status, b"Status"))]
    if body:
        head.append(b"Content-Type: application/json")
    head.append(b"Content-Length: %d" % len(body))
    head.extend(f"{k}: {v}".encode("latin-1") for k, v in headers.items())
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class McpHttpProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies; requests on one connection are answered in order."""

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self._finish(http_response(400, b"", {}), close=True)
                return
            lines = bytes(self.buffer[:end]).split(b"\r\n")
            parts = lines[0].split(b" ")
            method = parts[0]
            target = parts[1] if len(parts) > 1 else b""
            length = 0
            close = False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value.strip() or b"0")
                elif name == b"transfer-encoding":
                    self._finish(http_response(411, b"", {}), close=True)
                    return
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
            if length > MAX_BODY:
                self._finish(http_response(413, b"", {}), close=True)
                return
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4:end + 4 + length])
            del self.buffer[:end + 4 + length]
            self._finish(self._route(method, target, body), close=close)

    def _route(self, method: bytes, target: bytes, body: bytes) -> bytes:
        if target.split(b"?", 1)[0] != PATH:
            return http_response(404, b"", {})
        if method == b"POST":
            try:
                message = orjson.loads(body)
            except orjson.JSONDecodeError:
                return http_response(400, orjson.dumps({"jsonrpc": "2.0", "id": None,
                                                        "error": {"code": -32700, "message": "Parse error"}}), {})
            return http_response(*answer(message, self.catalogue))
        if method == b"DELETE":
            return http_response(200, b"", {})
        return http_response(405, b"", {"Allow": "POST, DELETE"})

    def _finish(self, response: bytes, *, close: bool) -> None:
        assert self.transport is not None
        self.transport.write(response)
        if close:
            self.transport.close()
            self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve_raw(host: str, port: int, catalogue: Catalogue) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: McpHttpProtocol(catalogue), host, port, backlog=1024)
    print(f"upstream-fast listening on http://{host}:{port}/mcp", flush=True)
    async with server:
        await server.serve_forever()


def serve_sdk(host: str, port: int) -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("upstream-sdk", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Return the given text."""
        return text

    print(f"upstream-sdk listening on http://{host}:{port}/mcp", flush=True)
    server.run("streamable-http", host=host, port=port, json_response=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--impl", choices=["raw", "sdk"], default="raw")
    parser.add_argument("--structured", action="store_true",
                        help="raw: echo declares an outputSchema and answers with structuredContent")
    parser.add_argument("--tools", type=int, default=1,
                        help="raw: list this many tools, echo and generated ones of about 1.3 KB (default: 1)")
    args = parser.parse_args()
    if args.tools < 1:
        parser.error("--tools must be >= 1 (echo is always listed)")
    if args.impl == "sdk":
        serve_sdk(args.host, args.port)
        return
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_raw(args.host, args.port, Catalogue.build(tools=args.tools, structured=args.structured)))


if __name__ == "__main__":
    main()
