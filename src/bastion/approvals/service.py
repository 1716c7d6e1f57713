"""``ApprovalService``: open, wait for, list, decide and watch pending approvals.

The service interface other parts use (the pipeline guard, the admin API, the admin console):

- ``request(...)``: open a pending approval for a held call and wait for its verdict (the guard);
- ``list()`` / ``get(id)``: what is pending, on every replica when Redis is configured;
- ``decide(id, approve, by=..., channel=...)``: an admin's (or the calling user's) answer; the first verdict wins;
- ``subscribe()``: an async iterator of ``ApprovalEvent`` (opened, decided) for live views.

Why one claim per approval: the user's elicitation answer, admins on any replica and the timeout may all answer
at once; ``claim`` removes the pending entry atomically, so exactly one verdict is applied and audited. The
waiting call learns a verdict given elsewhere over pub/sub (Redis) or directly (same replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from bastion.approvals.config import ApprovalsConfig
from bastion.approvals.model import Channel, PendingApproval, Verdict, new_approval_id
from bastion.approvals.store import ApprovalStore, MemoryApprovalStore, RedisApprovalStore
from bastion.errors import BastionError
from bastion.stopping import cancel_and_wait

log = structlog.get_logger("bastion.approvals")

# How long a waiter whose own claim lost waits for the winning verdict to arrive (it is already on its way).
_LOST_CLAIM_GRACE_S = 5.0


class ApprovalsFull(BastionError):
    """A cap on pending approvals is reached; the call is refused rather than queued without bound."""

    def __init__(self, scope: Literal["total", "principal"]) -> None:
        where = "for this caller" if scope == "principal" else "in total"
        super().__init__(f"too many calls are waiting for approval ({where})")
        self.scope = scope


class NotAnApprover(BastionError):
    """The rule holding this call lets only the calling user decide (``approval.via`` without ``admin``): no
    admin channel may answer for them, whichever door (admin API, CLI, console) the admin comes through."""

    def __init__(self, rule_id: str, message: str | None = None) -> None:
        super().__init__(message or f"rule {rule_id!r} lets only the calling user decide (approval.via: [user])")
        self.rule_id = rule_id


class SelfApproval(NotAnApprover):
    """An administrator approving their own held call. The admin channels are the second pair of eyes; the
    calling user's own say goes through the client (``via: [user]``), where a person sees the question. Otherwise
    an agent holding a key in an admin group approves itself through the admin API."""

    def __init__(self, rule_id: str, principal: str) -> None:
        super().__init__(rule_id, f"{principal!r} may not approve their own call (rule {rule_id!r}): an "
                                  f"administrator's approval must come from someone else")


# The channels through which an administrator, not the calling user, answers.
ADMIN_CHANNELS: frozenset[Channel] = frozenset({"admin_api", "cli", "console"})


@dataclass(frozen=True, slots=True)
class ApprovalEvent:
    """``opened`` carries the pending approval; ``decided`` its id and verdict."""

    kind: Literal["opened", "decided"]
    approval_id: str
    pending: PendingApproval | None = None
    verdict: Verdict | None = None


# A way to ask the calling user (the client's elicitation); returns their verdict, or None if they cannot answer.
UserAsk = Callable[[PendingApproval], Coroutine[Any, Any, Verdict | None]]


class ApprovalService:
    def __init__(self, config: ApprovalsConfig, store: ApprovalStore | None = None, *,
                 replica: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store: ApprovalStore = store if store is not None else MemoryApprovalStore()
        self.replica = replica or secrets.token_hex(4)
        self._clock = clock
        self._waiting: dict[str, asyncio.Future[Verdict]] = {}
        self._subscribers: set[asyncio.Queue[ApprovalEvent]] = set()
        self._listener: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """With Redis: listen for verdicts given on other replicas."""
        if isinstance(self.store, RedisApprovalStore) and self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="bastion-approvals-listener")

    async def aclose(self) -> None:
        if self._listener is not None:
            await cancel_and_wait([self._listener])
            self._listener = None

    # -- the held call's side -------------------------------------------------------------------------------

    async def request(self, *, principal: str, tool: str, upstream: str, rule_id: str, message: str | None,
                      arguments: dict[str, str], via: tuple[str, ...], timeout_s: float, session: str | None,
                      ask_user: UserAsk | None, approval_id: str | None = None) -> tuple[PendingApproval, Verdict]:
        """Open a pending approval and wait for the first verdict: the user's (through ``ask_user``), an
        admin's (``decide``), or the timeout. Cancelling the caller withdraws it. Raises ``ApprovalsFull``."""
        now = self._clock()
        pending = PendingApproval(id=approval_id or new_approval_id(), principal=principal, tool=tool,
                                  upstream=upstream, rule_id=rule_id, message=message, arguments=arguments, via=via,
                                  created_at=now,
                                  expires_at=now + timeout_s, session=session, replica=self.replica)
        fut: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._waiting[pending.id] = fut
        try:
            placed = await self.store.open(pending, self.config.max_pending, self.config.max_pending_per_principal)
            if placed != 1:
                raise ApprovalsFull("total" if placed == 0 else "principal")
            self._publish_local(ApprovalEvent("opened", pending.id, pending=pending))
            await self._broadcast({"type": "opened", "pending": pending.to_json()})
            return pending, await self._wait(pending, fut, timeout_s, ask_user)
        except asyncio.CancelledError:
            # The client went away: withdraw, so no admin approves a call nobody waits for.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._finish(pending.id, Verdict("withdrawn", "gateway", at=self._clock())))
            raise
        finally:
            self._waiting.pop(pending.id, None)

    async def _wait(self, pending: PendingApproval, fut: asyncio.Future[Verdict], timeout_s: float,
                    ask_user: UserAsk | None) -> Verdict:
        user_task: asyncio.Task[Verdict | None] | None = None
        if ask_user is not None and "user" in pending.via:
            user_task = asyncio.create_task(ask_user(pending))
        try:
            deadline = asyncio.get_running_loop().time() + timeout_s
            waiters: set[asyncio.Future[Any]] = {fut}
            if user_task is not None:
                waiters.add(user_task)
            while not fut.done():
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                done, _ = await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if user_task is not None and user_task in done:
                    waiters.discard(user_task)
                    answer = user_task.result() if not user_task.cancelled() and user_task.exception() is None \
                        else None
                    user_task = None
                    if answer is not None:
                        return await self._settle(pending.id, answer, fut)
            if fut.done():
                return fut.result()
            return await self._settle(pending.id, Verdict("timed_out", "gateway", at=self._clock()), fut)
        finally:
            if user_task is not None:
                user_task.cancel()

    async def _settle(self, approval_id: str, verdict: Verdict, fut: asyncio.Future[Verdict]) -> Verdict:
        """Apply ``verdict`` if it is first; otherwise the verdict that won (already on its way)."""
        if await self._finish(approval_id, verdict):
            return verdict
        try:
            async with asyncio.timeout(_LOST_CLAIM_GRACE_S):
                return await asyncio.shield(fut)
        except TimeoutError:
            # The winner's message was lost (Redis hiccup): nobody's yes is known here, so the call does not run.
            return Verdict("timed_out", "gateway", at=self._clock())

    # -- the approvers' side --------------------------------------------------------------------------------

    async def list(self) -> list[PendingApproval]:
        now = self._clock()
        items = await self.store.list()
        for stale in [p for p in items if p.expires_at + _LOST_CLAIM_GRACE_S * 2 < now]:
            # Left behind by a replica that died while the call waited: nobody will resume it.
            await self.store.claim(stale.id)
        return [p for p in items if p.expires_at + _LOST_CLAIM_GRACE_S * 2 >= now]

    async def get(self, approval_id: str) -> PendingApproval | None:
        return await self.store.get(approval_id)

    async def decide(self, approval_id: str, approve: bool, *, by: str, channel: Channel) -> Verdict | None:
        """An approver's answer. Returns the verdict applied, or None when the approval is no longer pending
        (decided, timed out or withdrawn already, or never existed). Raises ``NotAnApprover`` when an admin
        channel answers a call whose rule leaves the decision to the calling user: checked here, where every
        channel's decision passes, so no door can forget it; and ``SelfApproval`` when an administrator approves
        their own call (declining it is theirs to do)."""
        if channel in ADMIN_CHANNELS:
            pending = await self.store.get(approval_id)
            if pending is not None and "admin" not in pending.via:
                raise NotAnApprover(pending.rule_id)
            if pending is not None and approve and by == pending.principal:
                raise SelfApproval(pending.rule_id, by)
        verdict = Verdict("approved" if approve else "declined", channel, by=by, at=self._clock())
        return verdict if await self._finish(approval_id, verdict) else None

    async def subscribe(self) -> AsyncIterator[ApprovalEvent]:
        """Events as they happen on this replica, and (with Redis) on every other one."""
        queue: asyncio.Queue[ApprovalEvent] = asyncio.Queue(maxsize=1000)
        self._subscribers.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._subscribers.discard(queue)

    # -- remembered yeses -----------------------------------------------------------------------------------

    async def remembered(self, key: str) -> bool:
        return await self.store.remembered(key)

    async def remember(self, key: str, ttl_s: float) -> None:
        await self.store.remember(key, ttl_s)

    # -- internals ------------------------------------------------------------------------------------------

    async def _finish(self, approval_id: str, verdict: Verdict) -> bool:
        claimed = await self.store.claim(approval_id)
        if claimed is None:
            return False
        self._resolve(approval_id, verdict)
        await self._broadcast({"type": "decided", "id": approval_id, "verdict": verdict.to_json()})
        return True

    def _resolve(self, approval_id: str, verdict: Verdict) -> None:
        fut = self._waiting.get(approval_id)
        if fut is not None and not fut.done():
            fut.set_result(verdict)
        self._publish_local(ApprovalEvent("decided", approval_id, verdict=verdict))

    async def _broadcast(self, event: dict[str, Any]) -> None:
        if isinstance(self.store, RedisApprovalStore):
            event["replica"] = self.replica
            try:
                await self.store.publish(event)
            except Exception as exc:
                # One line, not a traceback: a Redis outage is an operational event with its own metrics.
                log.warning("approvals.publish_failed", event=event.get("type"), detail=f"{type(exc).__name__}: {exc}")

    def _publish_local(self, event: ApprovalEvent) -> None:
        for queue in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(event)

    async def _listen(self) -> None:
        assert isinstance(self.store, RedisApprovalStore)
        while True:
            try:
                async for event in self.store.listen():
                    if event.get("replica") == self.replica:
                        continue  # applied locally already
                    try:
                        if event.get("type") == "decided":
                            self._resolve(str(event["id"]), Verdict.from_json(event["verdict"]))
                        elif event.get("type") == "opened":
                            pending = PendingApproval.from_json(event["pending"])
                            self._publish_local(ApprovalEvent("opened", pending.id, pending=pending))
                    except (KeyError, TypeError, ValueError):
                        log.warning("approvals.bad_event")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Redis went away: waiting calls still time out on their own; listen again when it is back. One
                # line, not a traceback: an outage is an operational event, not a bug.
                log.warning("approvals.listen_failed", detail=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(1.0)
