"""Which context a call belongs to: the key its touches are kept under.

- Session-based eras: the MCP session. It is bastion's own (random, server-issued) id, so a client cannot pick
  or share one; a new session starts with a clean history, as does the agent conversation behind it.
- Stateless era (2026-07-28): there is no session, so the context is the principal, and the flow settings'
  ``stateless_window`` bounds how far back it reaches. A client-supplied conversation id is deliberately NOT used:
  whoever controls the client could give every call a fresh one and so never carry history. The price is false
  positives: two conversations of one principal within the window share a history (the safe direction).
"""

from __future__ import annotations

from functools import partial

import structlog

from bastion.call import CallContext
from bastion.flow.store import FlowStore
from bastion.policy.flow import FlowHistory, FlowSettings, ReadHistory

log = structlog.get_logger("bastion.flow")


def context_key(ctx: CallContext) -> tuple[str, bool]:
    """The context of ``ctx`` and whether it is windowed (stateless era: the principal over a time window)."""
    if ctx.session_id is not None:
        return f"s:{ctx.session_id}", False
    return f"p:{ctx.principal.id}", True


async def load_history(store: FlowStore, settings: FlowSettings, ctx: CallContext, now: float) -> FlowHistory | None:
    """The history a decision reads for ``ctx``, or None if the store failed (the decision then fails closed)."""
    context, windowed = context_key(ctx)
    reach = min(settings.retention_s, settings.stateless_window_s) if windowed else settings.retention_s
    try:
        touches = await store.history(context, now - reach)
    except Exception as exc:
        log.warning("flow.history_unavailable", error=type(exc).__name__, tool=ctx.tool.public_name[:200])
        return None
    return FlowHistory(touches, now)


def history_reader(store: FlowStore) -> ReadHistory:
    """``load_history`` over ``store``: how the policy guard reads a context's history."""
    return partial(load_history, store)
