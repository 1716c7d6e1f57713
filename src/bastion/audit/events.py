"""``AuditEvents``: every audit record that is not a tool call's own, written through one small interface.

A tool call's record is the pipeline's business (``audit.hook``: exactly one per call, possibly fail-closed).
Everything else the gateway audits goes through here, so one file lists what bastion records besides calls and
each record's fields come from one place: sessions starting and ending, policy reloads, authentication
failures, what the catalogue dropped or quarantined and why (limits, blocked definitions, drifted pins) and
definition findings. ``emit`` takes a record built elsewhere (the front door's ``tools.list`` record, approval
and console actions).

Two ways to write: ``await`` the method from async code, or ``soon``/the ``*_soon`` methods from synchronous
code (a watcher callback, a store's expiry sweep): those are scheduled on the running loop and kept referenced
until written, so none can be garbage-collected half-way; ``flush`` waits for them at shutdown, before the
sinks close.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal

from bastion.audit.record import (
    AuthFailureReason,
    auth_failure_record,
    catalogue_drop_record,
    catalogue_limit_record,
    definition_finding_record,
    pin_drift_record,
    policy_reload_record,
    session_record,
)
from bastion.call import Era
from bastion.catalogue_limits import LimitDrop
from bastion.principal import Principal

# Writes one record (``AuditLog.emit``, or a test's list).
AuditEmit = Callable[[dict[str, Any]], Coroutine[Any, Any, None]]

__all__ = ["AuditEmit", "AuditEvents", "auth_failure_reason"]


class AuditEvents:
    def __init__(self, emit: AuditEmit, clock: Callable[[], float] = time.time) -> None:
        self.emit = emit
        self._clock = clock
        self._pending: set[asyncio.Task[None]] = set()

    def soon(self, record: dict[str, Any]) -> None:
        """Write ``record`` from synchronous code: scheduled on the running loop, referenced until written."""
        task = asyncio.get_running_loop().create_task(self.emit(record))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def flush(self) -> None:
        """Wait for the records scheduled so far (at shutdown, before the sinks close)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    # -- sessions -----------------------------------------------------------------------------------------------

    async def session_started(self, session: str, *, era: Era, principal: Principal,
                              client_info: Mapping[str, Any], protocol_version: str | None) -> None:
        await self.emit(session_record("session.start", at=self._clock(), session=session, era=era,
                                       principal=principal, client_info=dict(client_info),
                                       protocol_version=protocol_version, reason=None))

    async def session_ended(self, session: str, *, era: Era, principal: Principal | None,
                            client_info: Mapping[str, Any], protocol_version: str | None, reason: str,
                            created_at: float | None = None) -> None:
        await self.emit(self._session_end(session, era=era, principal=principal, client_info=client_info,
                                          protocol_version=protocol_version, reason=reason, created_at=created_at))

    def session_ended_soon(self, session: str, *, era: Era, principal: Principal | None,
                           client_info: Mapping[str, Any], protocol_version: str | None, reason: str,
                           created_at: float | None = None) -> None:
        self.soon(self._session_end(session, era=era, principal=principal, client_info=client_info,
                                    protocol_version=protocol_version, reason=reason, created_at=created_at))

    def _session_end(self, session: str, *, era: Era, principal: Principal | None, client_info: Mapping[str, Any],
                     protocol_version: str | None, reason: str, created_at: float | None) -> dict[str, Any]:
        # ``created_at`` known (a session the store swept or closed at shutdown): the record says how long it lived.
        now = self._clock()
        return session_record("session.end", at=now, session=session, era=era, principal=principal,
                              client_info=dict(client_info), protocol_version=protocol_version, reason=reason,
                              duration_ms=(now - created_at) * 1000 if created_at else None)

    # -- policy and authentication ---------------------------------------------------------------------------------

    def policy_reloaded_soon(self, outcome: Literal["applied", "rejected", "unchanged"], *, source: str,
                             digest: str | None, rules: int | None = None, error: str | None = None) -> None:
        """From the policy watcher's callback (synchronous)."""
        self.soon(policy_reload_record(at=self._clock(), outcome=outcome, source=source, digest=digest, rules=rules,
                                       error=error))

    async def auth_failed(self, detail: str | None, *, method: str, remote_addr: str | None,
                          traceparent: str | None, principal: Principal | None = None, session: str | None = None,
                          era: Era | None = None) -> None:
        """``detail`` is the authenticator's operator-facing reason; the record keeps only its class. A stream's
        credential failing when presented again names the principal it authenticated, and its session."""
        await self.emit(auth_failure_record(at=self._clock(), reason=auth_failure_reason(detail), method=method,
                                            remote_addr=remote_addr, traceparent=traceparent, principal=principal,
                                            session=session, era=era))

    # -- the catalogue ----------------------------------------------------------------------------------------------

    async def catalogue_limit(self, drop: LimitDrop) -> None:
        await self.emit(catalogue_limit_record(at=self._clock(), drop=drop))

    async def catalogue_drop(self, *, upstream: str, item_kind: str, item: str, reason: str, action: str) -> None:
        """An item clients do not get as its upstream offered it (``dropped`` or ``quarantined``), and why."""
        await self.emit(catalogue_drop_record(at=self._clock(), upstream=upstream, item_kind=item_kind, item=item,
                                              reason=reason, action=action))

    async def definition_finding(self, *, upstream: str, item_kind: str, item: str, finding: str, action: str,
                                 fields: Sequence[str] = (), count: int = 1) -> None:
        await self.emit(definition_finding_record(at=self._clock(), upstream=upstream, item_kind=item_kind,
                                                  item=item, finding=finding, action=action, fields=fields,
                                                  count=count))

    async def pin_drift(self, *, upstream: str, tool: str, pinned: str, observed: str,
                        action: Literal["blocked", "warned"]) -> None:
        await self.emit(pin_drift_record(at=self._clock(), upstream=upstream, tool=tool, pinned=pinned,
                                         observed=observed, action=action))


def auth_failure_reason(detail: str | None) -> AuthFailureReason:
    """The audit record's failure class, from the authenticator's operator-facing reason."""
    text = (detail or "").lower()
    table: tuple[tuple[str, AuthFailureReason], ...] = (
        ("missing", "missing_credentials"), ("malformed", "malformed_credentials"), ("expired", "expired"),
        ("not yet valid", "not_yet_valid"), ("issuer", "invalid_issuer"), ("audience", "invalid_audience"),
        ("signature", "invalid_signature"), ("unknown", "unknown_key"), ("claim", "missing_claim"),
        ("jwks", "jwks_unavailable"))
    for needle, reason in table:
        if needle in text:
            return reason
    return "other"
