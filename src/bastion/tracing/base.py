"""The interface the core calls for tracing, and its no-op form (see ``bastion.tracing`` for the whole story).

Apart from ``bastion.tracing`` so that the OpenTelemetry implementation (``otel``) can share the no-op context
managers without importing the package that imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from bastion.call import CallContext, CallRecord

__all__ = ["NO_TRACING", "NULL", "NoTracing", "Same", "Tracing"]


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


class Null:
    """A reusable context manager that yields ``None`` and swallows nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class Same:
    __slots__ = ("value",)

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def __enter__(self) -> dict[str, Any]:
        return self.value

    def __exit__(self, *exc: object) -> None:
        return None


NULL = Null()


class NoTracing:
    """Tracing off: every hook is a constant-time no-op, and the SDK stays unimported."""

    enabled = False

    def request(self, method: str, *, target: str | None, meta: Mapping[str, Any], traceparent: str | None,
                tracestate: str | None, attributes: Mapping[str, str | int]) -> AbstractContextManager[None]:
        return NULL

    def stage(self, name: str) -> AbstractContextManager[None]:
        return NULL

    def forward(self, upstream: str, method: str,
                params: dict[str, Any]) -> AbstractContextManager[dict[str, Any]]:
        return Same(params)

    def call_outcome(self, ctx: CallContext, record: CallRecord, outcome: str) -> None:
        return None

    def traceparent(self) -> str | None:
        return None

    def shutdown(self) -> None:
        return None


NO_TRACING: Tracing = NoTracing()
