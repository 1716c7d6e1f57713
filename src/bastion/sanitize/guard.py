"""The response guard: sanitize every ``tools/call`` result before it leaves bastion."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import orjson
import structlog

from bastion.call import CallContext, CallRecord
from bastion.errors import ToolError
from bastion.outcome import Outcome
from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.result import sanitize_result

log = structlog.get_logger("bastion.sanitize")

# Called once per call that had any action, with the upstream, the upstream-side tool name and the counts
# (``class -> n``). The metrics module turns it into ``bastion_sanitize_actions_total{upstream,tool,class}``.
CountsHook = Callable[[str, str, Mapping[str, int]], None]

# Results larger than this (as JSON) are sanitized on a thread of their own. The work is bounded by what may leave
# (``max_result_bytes``), but hostile text at that bound still costs the better part of a second or more: on the
# event loop that would hold every other call; on the thread the loop keeps its turn at the interpreter (every
# switch interval, 5 ms) and other calls go on. Below it, the hand-off would cost more than the sanitizing.
OFF_LOOP_BYTES = 64 * 1024


class ResultWithheld(ToolError):
    """The sanitized result may not reach the client (``injection: block``, or structured output too large)."""

    outcome: ClassVar[Outcome | None] = "denied"


class SanitizeGuard:
    name = "sanitize"

    def __init__(self, config: SanitizeConfig, *, on_counts: CountsHook | None = None) -> None:
        self._config = config
        self._on_counts = on_counts
        # One thread: large results wait their turn behind each other rather than take more of the interpreter
        # from the event loop. Made on the first large result.
        self._lane: ThreadPoolExecutor | None = None

    async def apply(self, ctx: CallContext, result: dict[str, Any], record: CallRecord) -> dict[str, Any]:
        policy = self._config.for_tool(ctx.tool.upstream, ctx.tool.original_name)
        if not policy.enabled:
            return result
        if _large(result):
            if self._lane is None:
                self._lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bastion-sanitize")
            sanitized, report = await asyncio.get_running_loop().run_in_executor(
                self._lane, sanitize_result, result, policy)
        else:
            sanitized, report = sanitize_result(result, policy)
        if report.counts:
            for key, n in report.counts.items():
                record.sanitize[key] = record.sanitize.get(key, 0) + n
            if self._on_counts is not None:
                self._on_counts(ctx.tool.upstream, ctx.tool.original_name, report.counts)
            if report.injection:
                log.warning("sanitize_injection_suspected", request_id=ctx.request_id, tool=ctx.tool.public_name,
                            action=policy.injection,
                            markers=sorted(k for k in report.counts if k.startswith("injection:")))
        if report.withheld is not None:
            raise ResultWithheld(report.withheld, log_detail=f"sanitize counts: {report.counts}")
        return sanitized


def _large(result: dict[str, Any]) -> bool:
    content = result.get("content")
    # The usual large result, one long text first, is told without encoding it (tens of megabytes: 0.1 s).
    first = content[0] if type(content) is list and content else None
    if type(first) is dict and len(text := first.get("text") or "") > OFF_LOOP_BYTES and type(text) is str:
        return True
    # One C-speed encode (about 0.15 µs for a small result): cheaper than any walk that would estimate the size.
    try:
        return len(orjson.dumps(result)) > OFF_LOOP_BYTES
    except TypeError:  # orjson.JSONEncodeError included: a value it cannot encode is not a small one
        return True
