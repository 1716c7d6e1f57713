"""The ``quarantine`` request guard: tools bastion refuses whatever the policy says.

A tool is quarantined when its schema is hostile or invalid, when its pinned definition changed and no admin
approved the change (``PinTools``), or when the sanitizer blocked its definition. Quarantined tools are hidden
from lists already; this guard makes calls agree, answering exactly like an unknown tool. It reads the current
view's quarantine map, so it costs no I/O per call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack

from bastion.call import CallContext, CallRecord
from bastion.errors import UnknownTool


class QuarantineGuard:
    name = "quarantine"

    def __init__(self, quarantined: Callable[[], Mapping[str, str]]) -> None:
        self._quarantined = quarantined

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None:
        reason = self._quarantined().get(ctx.tool.public_name)
        if reason is not None:
            record.reason = f"tool quarantined: {reason}"
            raise UnknownTool(ctx.tool.public_name, log_detail=record.reason)
