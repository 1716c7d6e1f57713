"""Flow-aware policies, the I/O part: where a context's touches live and how a finished call adds to them.

The decision itself is pure (``bastion.policy.flow`` and ``PolicySet.decide``); this package reads a context's
history before the decision and writes touches after the call.
"""

from bastion.flow.context import context_key, history_reader
from bastion.flow.record import FlowRecorder
from bastion.flow.store import FlowStore, MemoryFlowStore, RedisFlowStore

__all__ = ["FlowRecorder", "FlowStore", "MemoryFlowStore", "RedisFlowStore", "context_key", "history_reader"]
