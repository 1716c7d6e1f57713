"""``listen.client_backlog`` bounds every client stream's queue (bastion.backlog): a call's SSE response and a
session's GET stream, through the real app."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bastion import jsonrpc
from tests.support.inprocess import front_door


async def test_the_configured_backlog_bounds_call_streams_and_get_streams(tmp_path: Path) -> None:
    async with front_door(tmp_path, listen={"client_backlog": 16}) as door:
        parts = door.app.state.bastion
        headers = await door.session()
        call = jsonrpc.classify({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                      "params": {"name": "basic__echo", "arguments": {}}})
        assert parts.endpoint._responder.emitter("legacy", call, None, True).outbox.bound == 16

        # The GET stream, through the ASGI app itself (httpx's ASGI transport waits for a body that never ends).
        sent: list[dict[str, Any]] = []
        opened = asyncio.Event()
        gone = asyncio.Event()

        requested = []

        async def receive() -> dict[str, Any]:
            if not requested:
                requested.append(True)
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body":
                opened.set()

        raw = [(k.lower().encode(), v.encode()) for k, v in
               {**headers, "Accept": "text/event-stream", "Host": "127.0.0.1:8080"}.items()]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"", "headers": raw,
                 "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 8080), "root_path": "",
                 "app": door.app}
        task = asyncio.create_task(door.app(scope, receive, send))
        try:
            await asyncio.wait_for(opened.wait(), 10)
            assert sent[0]["status"] == 200
            stream = parts.gateway.live.get(headers["Mcp-Session-Id"]).get_stream
            assert stream is not None and stream.bound == 16
        finally:
            gone.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
