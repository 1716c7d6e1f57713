"""W3C Trace Context: read a ``traceparent`` header, so audit records join the trace it names (and the HTTP
transports can check the one they send).

Pure parsing. A malformed header is ignored rather than rejected: tracing is a courtesy, never a reason to fail
a call, and the spec asks receivers to restart the trace when the header is invalid.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["TraceContext", "parse_traceparent"]

# version "-" trace-id "-" parent-id "-" flags; later versions may append fields after another "-".
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_MAX_LEN = 512


class TraceContext(NamedTuple):
    """A tuple rather than a frozen dataclass: built for every audited call, and a frozen dataclass's
    ``__init__`` (an ``object.__setattr__`` per field) cost as much as parsing the header."""

    trace_id: str
    span_id: str
    sampled: bool


def parse_traceparent(header: str | None) -> TraceContext | None:
    """The trace context in ``header``, or ``None`` when it is absent or invalid (per W3C Trace Context §3.2)."""
    if not header or len(header) > _MAX_LEN:
        return None
    m = _TRACEPARENT.match(header.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return TraceContext(trace_id, span_id, bool(int(flags, 16) & 0x01))
