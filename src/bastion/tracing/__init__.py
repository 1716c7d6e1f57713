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
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from bastion.tracing.config import TracingConfig

if TYPE_CHECKING:
    from bastion.pipeline import CallContext, CallRecord

__all__ = ["NO_TRACING", "NoTracing", "Tracing", "TracingConfig", "build_tracing"]


class Tracing(Protocol):
    enabled: bool

    def request(self, method: str, *, target: str | None, meta: Mapping[str, Any], traceparent: str | None,
                tracestate: str | None, attributes: Mapping[str, str | int]) -> AbstractContextManager[None]:
        """The server span of one MCP request, continuing the client's trace (``_meta`` first, then the HTTP
        header). An exception leaving it marks the span failed with its JSON-RPC code."""
        ...

    def stage(self, name: str) -> AbstractContextManager[None]:
        """A child span for one pipeline stage (a guard, or the forward)."""
        ...

    def forward(self, upstream: str, method: str,
                params: dict[str, Any]) -> AbstractContextManager[dict[str, Any]]:
        """A client span for one request to an upstream; yields ``params`` with this span's context in ``_meta``
        (the HTTP transports mirror it into the ``traceparent`` header)."""
        ...

    def call_outcome(self, ctx: CallContext, record: CallRecord, outcome: str) -> None:
        """Put a tools/call's decision (outcome, rule, stage, upstream) on the request span."""
        ...

    def traceparent(self) -> str | None:
        """The current span's W3C ``traceparent``, or ``None`` when there is none (or tracing is off)."""
        ...

    def shutdown(self) -> None:
        """Export what is buffered and stop (at gateway shutdown)."""
        ...


class _Null:
    """A reusable context manager that yields ``None`` and swallows nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Same:
    __slots__ = ("value",)

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def __enter__(self) -> dict[str, Any]:
        return self.value

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


class NoTracing:
    """Tracing off: every hook is a constant-time no-op, and the SDK stays unimported."""

    enabled = False

    def request(self, method: str, *, target: str | None, meta: Mapping[str, Any], traceparent: str | None,
                tracestate: str | None, attributes: Mapping[str, str | int]) -> AbstractContextManager[None]:
        return _NULL

    def stage(self, name: str) -> AbstractContextManager[None]:
        return _NULL

    def forward(self, upstream: str, method: str,
                params: dict[str, Any]) -> AbstractContextManager[dict[str, Any]]:
        return _Same(params)

    def call_outcome(self, ctx: CallContext, record: CallRecord, outcome: str) -> None:
        return None

    def traceparent(self) -> str | None:
        return None

    def shutdown(self) -> None:
        return None


NO_TRACING: Tracing = NoTracing()


def build_tracing(config: TracingConfig | None, env: Mapping[str, str]) -> Tracing:
    """The gateway's tracing: the no-op unless configured (block or ``OTEL_*`` endpoint variable)."""
    config = config or TracingConfig()
    if not config.active(env):
        return NO_TRACING
    # Imported only here: an untraced gateway never loads the SDK.
    from bastion.tracing.otel import OtelTracing

    return OtelTracing(config)
