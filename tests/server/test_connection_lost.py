"""``on_lost``: a request learns that its connection is gone before its answer started, from the protocol's
``connection_lost``, with nothing of its own watching (uvicorn with bastion's protocol, in this process)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import uvicorn
from starlette.types import Message, Receive, Scope, Send

from bastion.server.protocol import FrontDoorOptions, front_door_protocol, on_lost
from tests.support.net import free_port
from tests.support.uvicorn_server import serving

HEAD = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class Seen:
    port: int
    lost: list[str] = field(default_factory=list)  # paths whose callback ran
    cancelled: list[str] = field(default_factory=list)  # paths whose task the callback cancelled
    waiting: dict[str, asyncio.Event] = field(default_factory=dict)  # set once the request is parked
    ended: dict[str, asyncio.Event] = field(default_factory=dict)  # set once the app returned


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[Seen]:
    seen = Seen(port=free_port())

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        task = asyncio.current_task()
        assert task is not None

        def lost() -> None:
            seen.lost.append(path)
            task.cancel()

        try:
            await receive()  # the body
            if path == "/started":
                await send({"type": "http.response.start", "status": 200, "headers": []})
            assert on_lost(receive, lost)
            if path == "/disarmed":
                assert on_lost(receive, None)
            seen.waiting[path].set()
            if path == "/parked":
                await asyncio.Event().wait()  # only a cancellation ends this
            message: Message = await receive()  # the disconnect, as uvicorn reports it
            assert message["type"] == "http.disconnect"
        except asyncio.CancelledError:
            seen.cancelled.append(path)
            task.uncancel()
        finally:
            seen.ended[path].set()

    config = uvicorn.Config(app, host="127.0.0.1", port=seen.port, http=front_door_protocol(FrontDoorOptions()),
                            ws="none", lifespan="off", log_config=None, access_log=False)
    async with serving(config):
        yield seen


async def hang_up(seen: Seen, path: str) -> None:
    seen.waiting[path] = asyncio.Event()
    seen.ended[path] = asyncio.Event()
    _, writer = await asyncio.open_connection("127.0.0.1", seen.port)
    writer.write(HEAD % path.encode())
    await asyncio.wait_for(seen.waiting[path].wait(), 5)
    writer.close()
    await writer.wait_closed()
    await asyncio.wait_for(seen.ended[path].wait(), 5)


async def test_a_lost_connection_calls_back_a_request_whose_answer_has_not_started() -> None:
    async with serve() as seen:
        await hang_up(seen, "/parked")
    assert seen.lost == ["/parked"]
    assert seen.cancelled == ["/parked"]


async def test_no_call_back_once_the_answer_started_or_after_it_was_taken_back() -> None:
    async with serve() as seen:
        await hang_up(seen, "/started")  # a stream's own writer notices the loss
        await hang_up(seen, "/disarmed")
    assert seen.lost == []
    assert seen.cancelled == []


async def test_under_another_server_nothing_is_armed() -> None:
    async def receive() -> Message:
        return {"type": "http.disconnect"}

    assert on_lost(receive, lambda: None) is False
