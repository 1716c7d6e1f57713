"""The ``refresh_gate`` request guard: no call reaches a tool definition that has not been checked.

Last before the forward, so nothing the guards judged can change unseen between their verdict and the upstream
receiving the call. Two checks:

1. When the tool's upstream is gated (it announced a tools change, or listed different definitions), wait for
   the refresh to publish a view that compared the new definitions with their pins, at most ``timeout_s``;
   then refuse with ``CatalogueChanging`` rather than forward on a definition nobody checked. An upstream that
   cannot answer (down, or the refresh could not reach it) is not waited for: the call is refused at once with
   ``UpstreamUnavailable`` (-31002), what the forward would have said, instead of -31010's "retry shortly".
2. The tool as the current view has it must be the definition the call was resolved and checked against: a tool
   quarantined or removed meanwhile answers like an unknown tool (as the quarantine guard does), a changed one
   is refused so the client lists again, and its arguments are validated against the new schema.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AsyncExitStack

from bastion.call import CallContext, CallRecord
from bastion.errors import CatalogueChanging, UnknownTool, UpstreamUnavailable
from bastion.refresh_gate import RefreshGate
from bastion.view import View


class RefreshGateGuard:
    name = "refresh_gate"

    def __init__(self, gate: RefreshGate, view: Callable[[], View], timeout_s: float) -> None:
        self._gate = gate
        self._view = view
        self._timeout_s = timeout_s

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None:
        entry = ctx.tool
        gate = self._gate
        if gate.is_closed(entry.upstream):
            started = time.perf_counter()
            opened = await gate.wait_open(entry.upstream, self._timeout_s)
            record.extra["refresh_wait_ms"] = round((time.perf_counter() - started) * 1000, 3)
            if not opened:
                unreachable = gate.unreachable_reason(entry.upstream)
                if unreachable is not None:
                    # The gate stays closed (nothing unchecked is forwarded), but a refresh cannot succeed now.
                    record.reason = f"upstream {entry.upstream!r} unavailable while its definitions were gated"
                    raise UpstreamUnavailable(entry.upstream, log_detail=unreachable)
                record.reason = f"definitions of upstream {entry.upstream!r} still being checked"
                raise CatalogueChanging(entry.upstream, entry.public_name, timeout_s=self._timeout_s)
        view = self._view()
        current = view.catalogue.tool(entry.public_name)
        if current is not None and current.public_name in view.quarantined:
            record.reason = f"tool quarantined while the call was checked: {view.quarantined[current.public_name]}"
            raise UnknownTool(entry.public_name, log_detail=record.reason)
        if current is entry:
            return
        if current is None:
            record.reason = "tool removed while the call was checked"
            raise UnknownTool(entry.public_name, log_detail=record.reason)
        if current.upstream != entry.upstream or current.upstream_definition != entry.upstream_definition:
            record.reason = "tool definition changed while the call was checked"
            raise CatalogueChanging(entry.upstream, entry.public_name)
