"""``CallResponse``: a ``tools/call`` for a client that accepts SSE runs in the request's own task, answers JSON
unless a message for the client comes first, then streams; cancellations by the client are answered, others
propagate. In process, over the real dispatcher and pipeline and a memory upstream, with a recording ASGI pair."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
import pytest

from bastion import jsonrpc
from bastion.server.emitter import StreamEmitter
from bastion.server.responder import CallResponse, Responder
from bastion.sessions.live import LiveSession
from bastion.upstream.base import RelatedMessageHandler
from tests.core import build
from tests.core.build import Core
from tests.support.memory_upstream import MemoryUpstream, text_result, tool


class Client:
    """The ASGI receive/send pair of one HTTP request whose body was already read."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def content_type(self) -> bytes:
        return dict(self.sent[0]["headers"])[b"content-type"]

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])

    def events(self) -> list[dict[str, Any]]:
        return [orjson.loads(line[len(b"data: "):]) for line in self.body.split(b"\n") if line.startswith(b"data: ")]


@pytest.fixture
async def core() -> AsyncIterator[Core]:
    up = MemoryUpstream("up", tools=[tool("echo"), tool("chatty"), tool("slow")])
    async with build.running_core(up) as core:
        yield core


def responder(core: Core) -> Responder:
    return Responder(core.gateway, core.dispatcher, itertools.count(1))


def call(name: str, rid: int = 7, meta: Mapping[str, Any] | None = None) -> jsonrpc.Message:
    params: dict[str, Any] = {"name": f"up__{name}", "arguments": {}}
    if meta:
        params["_meta"] = dict(meta)
    return build.request("tools/call", params, rid)


async def answer(core: Core, msg: jsonrpc.Message, client: Client, *, era: str = "legacy",
                 live: LiveSession | None = None) -> CallResponse:
    r = responder(core)
    scope = build.client_scope(era=era)  # type: ignore[arg-type]
    response = await r.respond(scope._replace(live=live), msg, live, sse_ok=True)
    assert isinstance(response, CallResponse)
    await response({"type": "http", "method": "POST"}, client.receive, client.send)  # type: ignore[arg-type]
    return response


async def test_a_plain_call_runs_in_the_requests_task_and_answers_json(core: Core) -> None:
    seen: list[asyncio.Task[Any] | None] = []

    async def echo(params: dict[str, Any], on_message: RelatedMessageHandler | None) -> dict[str, Any]:
        seen.append(asyncio.current_task())
        return text_result("hi")

    core.upstreams["up"].script("tools/call", "echo", handler=echo)
    client = Client()
    await answer(core, call("echo"), client)
    assert seen == [asyncio.current_task()]
    assert client.content_type == b"application/json"
    assert orjson.loads(client.body)["result"]["content"] == [{"type": "text", "text": "hi"}]


async def test_a_message_before_the_result_turns_the_answer_into_a_stream(core: Core) -> None:
    async def chatty(params: dict[str, Any], on_message: RelatedMessageHandler | None) -> dict[str, Any]:
        assert on_message is not None
        token = params["_meta"]["progressToken"]
        await on_message("notifications/progress", {"progressToken": token, "progress": 1, "total": 2})
        await asyncio.sleep(0.01)
        await on_message("notifications/progress", {"progressToken": token, "progress": 2, "total": 2})
        return text_result("done")

    core.upstreams["up"].script("tools/call", "chatty", handler=chatty)
    client = Client()
    await answer(core, call("chatty", meta={"progressToken": "p"}), client)
    assert client.content_type.startswith(b"text/event-stream")
    events = client.events()
    assert [e.get("method") for e in events] == ["notifications/progress", "notifications/progress", None]
    assert [e["params"]["progress"] for e in events[:2]] == [1, 2]
    assert events[-1]["id"] == 7 and events[-1]["result"]["content"][0]["text"] == "done"
    assert len(core.records()) == 1


async def test_the_clients_cancellation_is_answered_and_leaves_the_task_clean(core: Core) -> None:
    core.upstreams["up"].script("tools/call", "slow", result=text_result("late"), delay=30)
    live = LiveSession("s")
    client = Client()
    running = asyncio.create_task(answer(core, call("slow", rid=9), client, live=live))
    while 9 not in live.inflight:
        await asyncio.sleep(0)
    live.inflight[9].cancel()  # what notifications/cancelled does
    await running
    assert orjson.loads(client.body)["error"]["message"] == "Request cancelled"
    assert running.cancelling() == 0 and not running.cancelled()
    assert 9 not in live.inflight
    assert [r["outcome"] for r in core.records()] == ["client_disconnected"]


async def test_any_other_cancellation_propagates(core: Core) -> None:
    core.upstreams["up"].script("tools/call", "slow", result=text_result("late"), delay=30)
    live = LiveSession("s")
    running = asyncio.create_task(answer(core, call("slow", rid=9), Client(), live=live))
    while 9 not in live.inflight:
        await asyncio.sleep(0)
    running.cancel()  # a shutdown, not the client
    with pytest.raises(asyncio.CancelledError):
        await running
    assert [r["outcome"] for r in core.records()] == ["client_disconnected"]


async def test_closing_a_modern_stream_cancels_the_call(core: Core) -> None:
    started = asyncio.Event()

    async def chatty(params: dict[str, Any], on_message: RelatedMessageHandler | None) -> dict[str, Any]:
        assert on_message is not None
        await on_message("notifications/progress", {"progressToken": params["_meta"]["progressToken"],
                                                     "progress": 1})
        started.set()
        await asyncio.sleep(30)
        return text_result("never")

    core.upstreams["up"].script("tools/call", "chatty", handler=chatty)
    client = Client()
    running = asyncio.create_task(answer(core, call("chatty", meta={"progressToken": "p"}), client, era="modern"))
    await started.wait()
    client.gone.set()  # the client closes the stream
    await asyncio.wait_for(running, 5)
    assert [e.get("method") for e in client.events()] == ["notifications/progress"]  # no result after a cancel
    assert [r["outcome"] for r in core.records()] == ["client_disconnected"]


async def test_a_stream_emitter_built_by_the_front_door_is_used_as_is(core: Core) -> None:
    r = responder(core)
    msg = call("echo")
    emitter = r.emitter("legacy", msg, None, True)
    assert isinstance(emitter, StreamEmitter)
    scope = build.client_scope()._replace(emitter=emitter)
    response = await r.respond(scope, msg, None, sse_ok=True)
    assert isinstance(response, CallResponse) and response._scope is scope
