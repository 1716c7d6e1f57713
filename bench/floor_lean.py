"""A floor below uvicorn: an ``asyncio.Protocol`` with the ``httptools`` parser and bastion's upstream pool forwarding
each POST body to one upstream and its answer back, on uvloop, with nothing else: no ASGI scope, request cycle,
application layers, limits or checks.

    python bench/floor_lean.py --port 18183 --upstream http://127.0.0.1:18191/mcp

``instructions.py --scenario floor-lean`` counts it beside ``floor`` (the same forwarding under uvicorn): the
difference is what uvicorn's request cycle and the ASGI interface cost per request, the part of everything-off a
server of bastion's own could save. It is a measurement, not a server: it reads only ``Content-Length`` bodies,
answers every request with the upstream's status line as ``200 OK`` text, and serves one request at a time per
connection, which is all the load generator's closed-loop sessions need. It forwards ``Mcp-Session-Id`` and
``MCP-Protocol-Version`` both ways, as ``floor_asgi.py`` does.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httptools
import uvloop

from bastion.upstream.connections import H1Pool, Target


class LeanProtocol(asyncio.Protocol):
    def __init__(self, pool: H1Pool, target: Target) -> None:
        self.pool = pool
        self.target = target
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.headers = {}
        self.body = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        task = asyncio.get_running_loop().create_task(self.forward(self.headers, b"".join(self.body)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def forward(self, received: dict[bytes, bytes], body: bytes) -> None:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        session = received.get(b"mcp-session-id")
        if session:
            headers["Mcp-Session-Id"] = session.decode("latin-1")
        version = received.get(b"mcp-protocol-version")
        if version:
            headers["MCP-Protocol-Version"] = version.decode("latin-1")
        async with self.pool.post(self.target, headers, body) as response:
            data = await response.aread()
            head = [b"HTTP/1.1 %d OK\r\ncontent-type: " % response.status_code,
                    response.headers.get("content-type", "application/json").encode("latin-1"),
                    b"\r\ncontent-length: %d\r\n" % len(data)]
            answered = response.headers.get("mcp-session-id")
            if answered:
                head.append(b"mcp-session-id: " + answered.encode("latin-1") + b"\r\n")
            head.append(b"\r\n")
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(b"".join(head) + data)


async def serve(port: int, upstream: str) -> None:
    pool = H1Pool("floor-lean")
    target = Target.from_url(upstream)
    server = await asyncio.get_running_loop().create_server(lambda: LeanProtocol(pool, target), "127.0.0.1", port)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's MCP URL")
    args = parser.parse_args()
    uvloop.install()
    asyncio.run(serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
