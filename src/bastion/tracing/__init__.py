"""Tracing: the small interface the core calls, and its no-op form for when tracing is off.

The core (dispatch, pipeline, gateway) holds a ``Tracing`` and calls it at four places: one span per MCP request
(``request``), one per pipeline stage (``stage``), one per forward to an upstream (``forward``, which also returns
the params with the trace context in ``_meta``), and the call's outcome (``call_outcome``). ``traceparent`` gives
the current span's context for the audit record.

Off (the default), ``NO_TRACING`` answers every call with a shared do-nothing context manager: the OpenTelemetry
SDK is not even imported, so an untraced gateway pays a few attribute lookups per request and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping

from bastion.tracing.base import NO_TRACING, NoTracing, Tracing
from bastion.tracing.config import TracingConfig

__all__ = ["NO_TRACING", "NoTracing", "Tracing", "TracingConfig", "build_tracing"]


def build_tracing(config: TracingConfig | None, env: Mapping[str, str]) -> Tracing:
    """The gateway's tracing: the no-op unless configured (block or ``OTEL_*`` endpoint variable)."""
    config = config or TracingConfig()
    if not config.active(env):
        return NO_TRACING
    # Imported only here: an untraced gateway never loads the SDK.
    from bastion.tracing.otel import OtelTracing

    return OtelTracing(config)
