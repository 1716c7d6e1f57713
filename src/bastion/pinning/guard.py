"""``PinGuard``: a call to a quarantined tool is refused exactly as a call to a tool that does not exist.

It reads a snapshot the core keeps per catalogue (upstream -> quarantined original tool names), so it costs a dict
lookup per call and no I/O. The catalogue already hides these tools from ``tools/list``; this guard covers callers
that remember a name from before the change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from contextlib import AsyncExitStack

from bastion.errors import UnknownTool
from bastion.pipeline import CallContext, CallRecord

QuarantineSnapshot = Callable[[], Mapping[str, Set[str]]]
REASON = "tool quarantined: definition changed"


class PinGuard:
    name = "pinning"

    def __init__(self, quarantined: QuarantineSnapshot) -> None:
        self._quarantined = quarantined

    async def check(self, ctx: CallContext, record: CallRecord, cleanup: AsyncExitStack) -> None:
        names = self._quarantined().get(ctx.tool.upstream)
        if names is not None and ctx.tool.original_name in names:
            record.stage = "pinning"
            record.decision = "deny"
            record.reason = REASON
            raise UnknownTool(ctx.tool.public_name,
                              log_detail=f"{REASON} ({ctx.tool.upstream}/{ctx.tool.original_name})")
