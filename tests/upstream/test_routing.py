"""``RpcSession`` routing in-process: a response reaches only the request it answers, from the stream that request
owns; everything else is dropped, logged and reported. Ids are unique and unpredictable per connection."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping
from typing import Any

import pytest

from bastion.errors import ProtocolError, UpstreamTimeout
from bastion.upstream.ids import ID_BITS, RequestIds
from bastion.upstream.session import Pending, RpcSession


class Wire:
    """The upstream side of one connection: what bastion sent, and a session that reports strays."""

    def __init__(self, *, send_hangs: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.strays: list[tuple[str, str]] = []
        self.notifications: list[tuple[str, Mapping[str, Any]]] = []
        self.send_hangs = send_hangs
        self.rpc = RpcSession("hostile", self.send, on_stray=lambda up, reason: self.strays.append((up, reason)))

        async def on_notification(method: str, params: Mapping[str, Any]) -> None:
            self.notifications.append((method, params))

        self.rpc.on_notification = on_notification

    async def send(self, message: dict[str, Any]) -> None:
        if self.send_hangs:
            await asyncio.Event().wait()  # a frozen upstream that never reads
        self.sent.append(message)

    async def transmit(self, pending: Pending) -> None:
        self.sent.append(pending.message)

    def start(self, method: str = "tools/call", params: dict[str, Any] | None = None,
              on_message: Any = None, timeout: float = 5.0) -> asyncio.Task[dict[str, Any]]:
        return asyncio.create_task(self.rpc.call(method, params, timeout=timeout, on_message=on_message,
                                                 transmit=self.transmit))

    def pending(self) -> list[Pending]:
        return list(self.rpc._pending.values())


def answer(pending: Pending | int, text: str) -> dict[str, Any]:
    rid = pending.id if isinstance(pending, Pending) else pending
    return {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}]}}


async def two_calls(wire: Wire, **kw: Any) -> tuple[asyncio.Task[dict[str, Any]], asyncio.Task[dict[str, Any]],
                                                   Pending, Pending]:
    a = wire.start(**kw)
    b = wire.start(**kw)
    await asyncio.sleep(0)
    pa, pb = wire.pending()
    return a, b, pa, pb


def test_ids_are_unique_json_safe_and_not_a_counter() -> None:
    ids = RequestIds()
    drawn = [ids.next() for _ in range(50_000)]
    assert len(set(drawn)) == len(drawn)
    assert all(0 < i < 2 ** ID_BITS <= 2 ** 53 for i in drawn)
    steps = {b - a for a, b in itertools.pairwise(drawn)}
    assert len(steps) > 49_000  # no stride to extrapolate from
    assert RequestIds().next() != RequestIds().next()  # a fresh key per connection


def test_the_permutation_is_a_bijection() -> None:
    ids = RequestIds(key=b"k" * 32)
    small = 1 << 12
    # Distinct inputs never collide (checked exhaustively on a window; the Feistel structure makes it hold for all).
    assert len({ids.permute(v) for v in range(small)}) == small


async def test_a_response_on_another_requests_stream_is_dropped() -> None:
    wire = Wire()
    a, b, pa, pb = await two_calls(wire)
    # The upstream answers B's id on A's stream, carrying A's data: B must never see it.
    await wire.rpc.handle(answer(pb, "alice-secret"), related=pa)
    await asyncio.sleep(0)
    assert not b.done() and not a.done()
    assert wire.strays == [("hostile", "wrong_stream")]
    await wire.rpc.handle(answer(pa, "for a"), related=pa)
    await wire.rpc.handle(answer(pb, "for b"), related=pb)
    assert (await a)["content"][0]["text"] == "for a"
    assert (await b)["content"][0]["text"] == "for b"


async def test_a_stream_without_responses_delivers_none() -> None:
    wire = Wire()
    task = wire.start()
    await asyncio.sleep(0)
    (pending,) = wire.pending()
    await wire.rpc.handle(answer(pending, "forged on the GET stream"), answers=False)
    await asyncio.sleep(0.01)
    assert not task.done()
    assert wire.strays == [("hostile", "wrong_stream")]
    await wire.rpc.handle(answer(pending, "real"))
    assert (await task)["content"][0]["text"] == "real"


async def test_duplicate_late_unknown_and_malformed_ids_are_dropped_and_reported() -> None:
    wire = Wire()
    task = wire.start()
    await asyncio.sleep(0)
    (pending,) = wire.pending()
    await wire.rpc.handle(answer(pending, "first"))
    await wire.rpc.handle(answer(pending, "second"))  # before the caller ran: a duplicate
    assert (await task)["content"][0]["text"] == "first"
    await wire.rpc.handle(answer(pending, "third"))  # after it finished: late
    await wire.rpc.handle(answer(1, "guessed"))
    await wire.rpc.handle(answer("abc", "string id nobody sent"))
    await wire.rpc.handle({"jsonrpc": "2.0", "id": [1], "result": {}})
    await wire.rpc.handle({"jsonrpc": "2.0", "id": True, "result": {}})
    assert [r for _, r in wire.strays] == ["duplicate", "late", "unknown_id", "unknown_id", "malformed_id",
                                           "malformed_id"]


async def test_a_null_id_error_on_a_requests_own_stream_is_that_requests_error() -> None:
    wire = Wire()
    task = wire.start()
    await asyncio.sleep(0)
    (pending,) = wire.pending()
    await wire.rpc.handle({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}},
                          related=pending)
    with pytest.raises(Exception, match="Parse error"):
        await task


async def test_unhashable_ids_in_upstream_requests_and_cancellations_do_not_break_the_reader() -> None:
    wire = Wire()
    await wire.rpc.handle({"jsonrpc": "2.0", "id": {"x": 1}, "method": "sampling/createMessage"})
    await wire.rpc.handle({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": [1]}})
    task = wire.start()
    await asyncio.sleep(0)
    (pending,) = wire.pending()
    await wire.rpc.handle(answer(pending, "still serving"))
    assert (await task)["content"][0]["text"] == "still serving"


async def test_progress_for_another_requests_token_on_this_stream_is_dropped() -> None:
    wire = Wire()
    seen_a: list[tuple[str, Mapping[str, Any]]] = []
    seen_b: list[tuple[str, Mapping[str, Any]]] = []

    async def on_a(method: str, params: Mapping[str, Any]) -> None:
        seen_a.append((method, params))

    async def on_b(method: str, params: Mapping[str, Any]) -> None:
        seen_b.append((method, params))

    a = wire.start(params={"_meta": {"progressToken": "a-token"}}, on_message=on_a)
    b = wire.start(params={"_meta": {"progressToken": "b-token"}}, on_message=on_b)
    await asyncio.sleep(0)
    pa, pb = wire.pending()
    assert pa.message["params"]["_meta"]["progressToken"] == pa.id  # the client's token never goes upstream
    await wire.rpc.handle({"jsonrpc": "2.0", "method": "notifications/progress",
                           "params": {"progressToken": pb.id, "progress": 1, "message": "a's work"}}, related=pa)
    await wire.rpc.handle({"jsonrpc": "2.0", "method": "notifications/progress",
                           "params": {"progressToken": pb.id, "progress": 2}}, related=pb)
    assert seen_a == []
    assert seen_b == [("notifications/progress", {"progressToken": "b-token", "progress": 2})]
    for p in (pa, pb):
        await wire.rpc.handle(answer(p, "ok"), related=p)
    await asyncio.gather(a, b)


class Heard:
    """A call's relay that says which client session it serves, like the dispatcher's, and records what it got."""

    def __init__(self, name: str, audience: str | None, got: list[tuple[str, str]]) -> None:
        self.name = name
        self.owner = "anonymous"  # one principal throughout: the fan-out must not depend on it
        self.audience = audience
        self.got = got

    async def __call__(self, method: str, params: Mapping[str, Any]) -> None:
        self.got.append((self.name, str(params.get("data"))))


async def test_an_unattributable_log_message_reaches_every_caller_in_flight_once() -> None:
    wire = Wire()
    got: list[tuple[str, str]] = []

    def log_msg(data: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": data}}

    a = wire.start(on_message=Heard("a", "session-1", got))
    await asyncio.sleep(0)
    await wire.rpc.handle(log_msg("one"))  # one call in flight: it is that call's
    assert got == [("a", "one")] and wire.notifications == []
    b = wire.start(on_message=Heard("b", "session-2", got))
    c = wire.start(on_message=Heard("c", "session-1", got))
    d = wire.start(on_message=Heard("d", None, got))
    e = wire.start(on_message=Heard("e", None, got))
    await asyncio.sleep(0)
    got.clear()
    # Four clients in flight (two sessions, two sessionless requests), session-1 with two calls: whoever caused
    # it, it reaches them; session-1 once, on its most recent call. Never "nobody's": the caller that caused it
    # would lose it (a guess would too, whenever it guessed wrong).
    await wire.rpc.handle(log_msg("two"))
    assert sorted(got) == [("b", "two"), ("c", "two"), ("d", "two"), ("e", "two")]
    assert wire.notifications == []
    for p in wire.pending():
        await wire.rpc.handle(answer(p, "ok"))
    await asyncio.gather(a, b, c, d, e)
    await wire.rpc.handle(log_msg("three"))  # none in flight: unrelated
    assert wire.notifications == [("notifications/message", {"level": "info", "data": "three"})]


async def test_a_caller_whose_relay_fails_does_not_keep_a_log_message_from_the_others() -> None:
    wire = Wire()
    got: list[tuple[str, str]] = []

    async def broken(method: str, params: Mapping[str, Any]) -> None:
        raise RuntimeError("client went away")

    a = wire.start(on_message=broken)
    b = wire.start(on_message=Heard("b", "session-2", got))
    await asyncio.sleep(0)
    await wire.rpc.handle({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x"}})
    assert got == [("b", "x")]
    for p in wire.pending():
        await wire.rpc.handle(answer(p, "ok"))
    await asyncio.gather(a, b)


async def test_server_requests_without_one_owner_are_not_relayed() -> None:
    wire = Wire()

    async def relay(method: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
        raise AssertionError("must not be relayed")

    # No call in flight: roots/list gets an empty list (bastion advertises roots), sampling "method not found".
    await wire.rpc.handle({"jsonrpc": "2.0", "id": "r1", "method": "roots/list"})
    await wire.rpc.handle({"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage", "params": {}})
    a = wire.start(on_message=relay)
    b = wire.start(on_message=relay)
    await asyncio.sleep(0)
    # Two calls in flight on a transport that cannot say whose it is: refused, never relayed to a guess.
    await wire.rpc.handle({"jsonrpc": "2.0", "id": "s2", "method": "sampling/createMessage", "params": {}})
    await wire.rpc.handle({"jsonrpc": "2.0", "id": "r2", "method": "roots/list"})
    await asyncio.sleep(0.05)
    answers = {m["id"]: m for m in wire.sent if "method" not in m}
    assert answers["r1"]["result"] == {"roots": []}
    assert answers["r2"]["result"] == {"roots": []}
    assert answers["s1"]["error"]["code"] == -32601
    assert answers["s2"]["error"]["code"] == -32603
    for p in wire.pending():
        await wire.rpc.handle(answer(p, "ok"))
    await asyncio.gather(a, b)


class Owned:
    """A relay that says whose call it is, like the dispatcher's."""

    def __init__(self, owner: str, seen: list[str]) -> None:
        self.owner = owner
        self.seen = seen

    async def __call__(self, method: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
        self.seen.append(self.owner)
        return {"action": "decline"}


@pytest.mark.parametrize(("owners", "relayed"), [(("alice", "alice"), True), (("alice", "bob"), False)])
async def test_several_calls_of_one_principal_take_a_server_request_and_of_two_refuse_it(
        owners: tuple[str, str], relayed: bool) -> None:
    wire = Wire()
    seen: list[str] = []
    a = wire.start(on_message=Owned(owners[0], seen))
    b = wire.start(on_message=Owned(owners[1], seen))
    await asyncio.sleep(0)
    await wire.rpc.handle({"jsonrpc": "2.0", "id": "e1", "method": "elicitation/create", "params": {}})
    await asyncio.sleep(0.05)
    (reply,) = [m for m in wire.sent if m.get("id") == "e1"]
    if relayed:
        # Both calls are alice's: the most recent one is asked, and nobody else's client can be.
        assert seen == ["alice"] and reply["result"] == {"action": "decline"}
    else:
        assert seen == [] and reply["error"]["code"] == -32603
    for p in wire.pending():
        await wire.rpc.handle(answer(p, "ok"))
    await asyncio.gather(a, b)


class Silent(Owned):
    """A relay for a request whose answer is no stream (a prompts/get): it says whose request it is, and nothing
    reaches its client."""

    reaches_client = False


@pytest.mark.parametrize(("owners", "asked"), [(("alice", "bob"), None), (("alice", "alice"), "alice")])
async def test_a_request_that_cannot_relay_still_counts_as_its_callers(owners: tuple[str, str],
                                                                       asked: str | None) -> None:
    """Alice's call can relay; the other request (sent later) cannot. Bob's may be the one that asked: the question
    goes to nobody. When both are Alice's it goes to her call, the one that can reach her client."""
    wire = Wire()
    seen: list[str] = []
    a = wire.start(on_message=Owned(owners[0], seen))
    b = wire.start("prompts/get", on_message=Silent(owners[1], seen))
    await asyncio.sleep(0)
    await wire.rpc.handle({"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage", "params": {}})
    await wire.rpc.handle({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x"}})
    await asyncio.sleep(0.05)
    (reply,) = [m for m in wire.sent if m.get("id") == "s1"]
    if asked is None:
        assert reply["error"]["code"] == -32603
        assert seen == ["alice"]  # the log message only: it reaches whoever is calling, the question nobody
    else:
        assert reply["result"] == {"action": "decline"}
        assert seen == ["alice", "alice"]  # the question and the log message, both on the call that can relay
    for p in wire.pending():
        await wire.rpc.handle(answer(p, "ok"))
    await asyncio.gather(a, b)


async def test_a_timeout_answers_at_the_deadline_even_when_the_cancel_notice_cannot_be_sent() -> None:
    wire = Wire(send_hangs=True)
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout):
        await wire.rpc.call("tools/call", None, timeout=0.2, on_message=None, transmit=wire.transmit)
    assert time.monotonic() - started < 0.2 + 0.5
    assert len(wire.rpc._background) == 1  # the notice, still trying, in the background
    async with asyncio.timeout(2):
        await wire.rpc.aclose()  # and shutdown does not wait for it
    assert not wire.rpc._background


async def test_the_timeout_error_names_the_configured_timeout() -> None:
    wire = Wire()
    with pytest.raises(UpstreamTimeout) as info:
        await wire.rpc.call("tools/call", None, timeout=0.05, on_message=None, transmit=wire.transmit,
                            reported_timeout=5.0)
    assert "5 s" in info.value.message
    await wire.rpc.aclose()


async def test_a_relayed_server_request_error_is_answered() -> None:
    wire = Wire()

    async def refuse(method: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
        raise ProtocolError(-32601, "no")

    task = wire.start(on_message=refuse)
    await asyncio.sleep(0)
    (pending,) = wire.pending()
    await wire.rpc.handle({"jsonrpc": "2.0", "id": 7, "method": "elicitation/create", "params": {}}, related=pending)
    await asyncio.sleep(0.01)
    assert next(m for m in wire.sent if m.get("id") == 7)["error"]["code"] == -32601
    await wire.rpc.handle(answer(pending, "ok"), related=pending)
    await task


async def test_a_listen_request_never_owns_an_untagged_message() -> None:
    wire = Wire()
    got: list[str] = []

    async def listener(method: str, params: Mapping[str, Any]) -> None:
        got.append("listen")

    async def caller(method: str, params: Mapping[str, Any]) -> None:
        got.append("call")

    listen = asyncio.create_task(wire.rpc.call("subscriptions/listen", {}, timeout=None, on_message=listener,
                                               transmit=wire.transmit))
    call = wire.start(on_message=caller)
    await asyncio.sleep(0)
    await wire.rpc.handle({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info"}})
    assert got == ["call"]
    for p in wire.pending():
        await wire.rpc.handle(answer(p, "ok"))
    await asyncio.gather(listen, call)
