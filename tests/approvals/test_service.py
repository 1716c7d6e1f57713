"""``ApprovalService`` in process: first verdict wins, caps, withdrawal, timeout, events; in memory and on a real
Redis shared by two service instances (two replicas)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bastion.approvals import (
    ApprovalsConfig,
    ApprovalService,
    ApprovalsFull,
    NotAnApprover,
    PendingApproval,
    Verdict,
)
from bastion.approvals.service import SelfApproval
from bastion.approvals.store import COUNT_KEY, PENDING_KEY, RedisApprovalStore
from bastion.redisconn import ADMIN, SHARED, open_client
from tests.support.redis_server import RedisServer

CFG = ApprovalsConfig(max_pending=3, max_pending_per_principal=2)


def request(service: ApprovalService, principal: str = "alice", timeout_s: float = 10.0,
            ask_user: Any = None,
            via: tuple[str, ...] = ("user", "admin")) -> asyncio.Task[tuple[PendingApproval, Verdict]]:
    return asyncio.create_task(service.request(
        principal=principal, tool="fs__rm", upstream="fs", rule_id="r", message=None, arguments={"p": "x"},
        via=via, timeout_s=timeout_s, session=None, ask_user=ask_user))


async def pending_ids(service: ApprovalService, count: int) -> list[str]:
    for _ in range(200):
        items = await service.list()
        if len(items) >= count:
            return [p.id for p in items]
        await asyncio.sleep(0.01)
    raise AssertionError("not pending")


async def test_an_admin_verdict_resumes_the_call_and_only_the_first_counts() -> None:
    service = ApprovalService(CFG)
    call = request(service)
    [approval_id] = await pending_ids(service, 1)
    verdict = await service.decide(approval_id, True, by="root", channel="admin_api")
    assert verdict is not None and verdict.approved
    assert await service.decide(approval_id, False, by="other", channel="admin_api") is None
    _, got = await call
    assert got.outcome == "approved" and got.by == "root" and got.channel == "admin_api"
    assert await service.list() == []


@pytest.mark.parametrize("channel", ["admin_api", "cli", "console"])
async def test_no_admin_channel_decides_a_call_its_rule_leaves_to_the_user(channel: Any) -> None:
    service = ApprovalService(CFG)

    async def user_answers_later(pending: PendingApproval) -> Verdict | None:
        await asyncio.sleep(0.2)
        return Verdict("declined", "elicitation", by="alice", at=0.0)

    call = request(service, via=("user",), ask_user=user_answers_later)
    [approval_id] = await pending_ids(service, 1)
    with pytest.raises(NotAnApprover, match="only the calling user"):
        await service.decide(approval_id, True, by="root", channel=channel)
    _, got = await call  # still pending after the refused admin verdict: the user's answer is the one applied
    assert got.outcome == "declined" and got.channel == "elicitation"


@pytest.mark.parametrize("channel", ["admin_api", "cli", "console"])
async def test_no_admin_approves_their_own_call_through_any_admin_channel(channel: Any) -> None:
    # alice holds a key in an admin group: through the admin channels she may decline her own call (withdraw
    # it), never approve it; another administrator's approval is applied.
    service = ApprovalService(CFG)
    call = request(service, via=("admin",))
    [approval_id] = await pending_ids(service, 1)
    with pytest.raises(SelfApproval, match="may not approve their own call"):
        await service.decide(approval_id, True, by="alice", channel=channel)
    assert [p.id for p in await service.list()] == [approval_id]  # still pending
    verdict = await service.decide(approval_id, True, by="root", channel=channel)
    assert verdict is not None and verdict.by == "root"
    _, got = await call
    assert got.outcome == "approved" and got.by == "root"

    withdrawn = request(service, via=("admin",))
    [approval_id] = await pending_ids(service, 1)
    assert await service.decide(approval_id, False, by="alice", channel=channel) is not None
    _, got = await withdrawn
    assert got.outcome == "declined" and got.by == "alice"


async def test_caps_refuse_past_the_bounds_per_principal_and_in_total() -> None:
    service = ApprovalService(CFG)
    calls = [request(service), request(service)]
    await pending_ids(service, 2)
    with pytest.raises(ApprovalsFull) as per:
        await request(service)
    assert per.value.scope == "principal"
    calls.append(request(service, "bob"))
    await pending_ids(service, 3)
    with pytest.raises(ApprovalsFull) as total:
        await request(service, "carol")
    assert total.value.scope == "total"
    for task in calls:
        task.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    assert await service.list() == []  # cancelled calls withdrew, freeing the places


async def test_timeout_and_user_answer() -> None:
    service = ApprovalService(CFG)
    _, verdict = await request(service, timeout_s=0.05)
    assert verdict.outcome == "timed_out" and verdict.channel == "gateway"

    async def says_no(pending: PendingApproval) -> Verdict:
        return Verdict("declined", "elicitation", by=pending.principal)

    _, verdict = await request(service, ask_user=says_no)
    assert verdict.outcome == "declined" and verdict.by == "alice"


async def test_a_user_who_cannot_answer_leaves_it_to_an_admin() -> None:
    service = ApprovalService(CFG)

    async def no_answer(pending: PendingApproval) -> None:
        return None

    call = request(service, ask_user=no_answer)
    [approval_id] = await pending_ids(service, 1)
    await asyncio.sleep(0.05)
    assert not call.done()
    await service.decide(approval_id, False, by="root", channel="cli")
    assert (await call)[1].outcome == "declined"


async def test_subscribers_see_opened_and_decided() -> None:
    service = ApprovalService(CFG)
    events = service.subscribe()
    first = asyncio.create_task(anext(events))
    await asyncio.sleep(0)
    call = request(service)
    opened = await first
    assert opened.kind == "opened" and opened.pending is not None
    await service.decide(opened.approval_id, True, by="root", channel="console")
    decided = await anext(events)
    assert decided.kind == "decided" and decided.verdict is not None and decided.verdict.channel == "console"
    await call
    await events.aclose()


@pytest.fixture
async def two_replicas(redis_server: RedisServer) -> AsyncIterator[tuple[ApprovalService, ApprovalService]]:
    url = redis_server.url.replace("/0", "/6")
    clients = [open_client(url, SHARED) for _ in range(2)]
    listeners = [open_client(url, ADMIN) for _ in range(2)]
    await clients[0].delete(PENDING_KEY, COUNT_KEY)
    services = [ApprovalService(CFG, RedisApprovalStore(c, lc), replica=f"r{i}")
                for i, (c, lc) in enumerate(zip(clients, listeners, strict=True))]
    for service in services:
        await service.start()
    await asyncio.sleep(0.2)  # subscriptions in place
    yield services[0], services[1]
    for service in services:
        await service.aclose()
    for client in clients + listeners:
        await client.aclose()


async def test_a_verdict_given_on_one_replica_resumes_the_call_on_the_other(
        two_replicas: tuple[ApprovalService, ApprovalService]) -> None:
    a, b = two_replicas
    call = request(a)
    [approval_id] = await pending_ids(b, 1)
    assert (await b.get(approval_id)) is not None
    assert (await b.decide(approval_id, True, by="root", channel="admin_api")) is not None
    _, verdict = await asyncio.wait_for(call, 5)
    assert verdict.approved and verdict.by == "root"
    assert await a.list() == [] and await b.list() == []


async def test_caps_hold_across_replicas(two_replicas: tuple[ApprovalService, ApprovalService]) -> None:
    a, b = two_replicas
    calls = [request(a), request(b)]
    await pending_ids(a, 2)
    with pytest.raises(ApprovalsFull):
        await request(a)
    for task in calls:
        task.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    assert await a.list() == []
    call = request(b)  # the per-principal count came back down
    [approval_id] = await pending_ids(a, 1)
    await a.decide(approval_id, False, by="root", channel="cli")
    assert (await asyncio.wait_for(call, 5))[1].outcome == "declined"
