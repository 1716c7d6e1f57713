"""Tracing on: spans through the OpenTelemetry SDK, exported in batches over OTLP/HTTP.

Span tree of one MCP request (names and attributes after the OpenTelemetry semantic conventions for MCP and
GenAI, which are in Development status, plus bastion's own under ``bastion.*``)::

    tools/call {tool}            SERVER   mcp.method.name, gen_ai.tool.name, gen_ai.operation.name=execute_tool,
    │                                     jsonrpc.request.id, mcp.session.id, mcp.protocol.version,
    │                                     bastion.principal.id, bastion.decision, bastion.outcome, bastion.rule_id,
    │                                     bastion.upstream, rpc.response.status_code / error.type on failure
    ├── bastion.guard {name}     INTERNAL one per request guard (policy, ratelimit, input_schema, …)
    ├── bastion.forward          INTERNAL
    │   └── tools/call {orig}    CLIENT   the request to the upstream; its context goes out in ``params._meta``
    │                                     (and, on HTTP, the ``traceparent``/``tracestate`` headers)
    └── bastion.guard {name}     INTERNAL one per response guard (output_schema, sanitize, …)

The provider is this object's own, never the process-global one: a library imported by bastion cannot start
exporting spans through it, and two gateways in one process (the tests) do not share a pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bastion import __version__
from bastion.call import CallContext, CallRecord
from bastion.tracing.base import NULL, Same
from bastion.tracing.config import TracingConfig

__all__ = ["OtelTracing"]

_TARGET_FIELD = {"tools/call": "name", "prompts/get": "name"}
_UNKNOWN_SERVICE = "unknown_service"


def _error_attributes(span: trace.Span, exc: BaseException) -> None:
    """A failed span: its JSON-RPC code when the error has one (``rpc.response.status_code``), else its type."""
    code = getattr(exc, "code", None)
    if isinstance(code, int) and not isinstance(code, bool):
        span.set_attribute("rpc.response.status_code", str(code))
        span.set_attribute("error.type", str(code))
    else:
        span.set_attribute("error.type", type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, getattr(exc, "message", None) or type(exc).__name__))


class OtelTracing:
    enabled = True

    def __init__(self, config: TracingConfig) -> None:
        resource = Resource.create({SERVICE_VERSION: __version__,
                                    **({SERVICE_NAME: config.service_name} if config.service_name else {})})
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith(_UNKNOWN_SERVICE):
            # Neither the config nor OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES named it.
            resource = resource.merge(Resource({SERVICE_NAME: "bastion"}))
        # sampler=None: the SDK reads OTEL_TRACES_SAMPLER(_ARG); default parentbased_always_on.
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio)) if config.sample_ratio is not None else None
        self._provider = TracerProvider(resource=resource, sampler=sampler)
        # endpoint/headers None: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT / _HEADERS itself.
        exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint, headers=dict(config.headers) or None)
        # Batching (OTEL_BSP_* tune it) keeps export off the request path: spans are queued, a thread ships them.
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("bastion", __version__)
        self._propagator = TraceContextTextMapPropagator()

    # -- the request span -----------------------------------------------------------------------------------

    def request(self, method: str, *, target: str | None, meta: Mapping[str, Any], traceparent: str | None,
                tracestate: str | None, attributes: Mapping[str, str | int]) -> AbstractContextManager[None]:
        return self._request(method, target, meta, traceparent, tracestate, attributes)

    @contextmanager
    def _request(self, method: str, target: str | None, meta: Mapping[str, Any], traceparent: str | None,
                 tracestate: str | None, attributes: Mapping[str, str | int]) -> Iterator[None]:
        # The MCP convention carries trace context in params._meta, which survives any transport; the HTTP
        # header is the fallback for clients that only instrument their HTTP layer.
        carrier: dict[str, str] = {}
        if isinstance(meta.get("traceparent"), str):
            carrier["traceparent"] = meta["traceparent"]
            if isinstance(meta.get("tracestate"), str):
                carrier["tracestate"] = meta["tracestate"]
        elif traceparent is not None:
            carrier["traceparent"] = traceparent
            if tracestate is not None:
                carrier["tracestate"] = tracestate
        parent = self._propagator.extract(carrier)
        attrs: dict[str, str | int] = {"mcp.method.name": method, "jsonrpc.protocol.version": "2.0",
                                       "network.transport": "tcp", "network.protocol.name": "http", **attributes}
        if method == "tools/call" and target is not None:
            attrs["gen_ai.tool.name"] = target
            attrs["gen_ai.operation.name"] = "execute_tool"
        elif method == "prompts/get" and target is not None:
            attrs["gen_ai.prompt.name"] = target
        name = f"{method} {target}" if target is not None and method in _TARGET_FIELD else method
        with self._tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER, attributes=attrs,
                                                record_exception=False, set_status_on_exception=False) as span:
            try:
                yield
            except BaseException as exc:
                _error_attributes(span, exc)
                raise

    # -- children -------------------------------------------------------------------------------------------

    def stage(self, name: str) -> AbstractContextManager[None]:
        # An unsampled request's children would be unsampled too (the sampler is parent-based): skip making them.
        # This is what keeps a 1% sample ratio close to tracing off.
        if not trace.get_current_span().is_recording():
            return NULL
        return self._stage(name)

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        with self._tracer.start_as_current_span(f"bastion.{name}" if name == "forward" else f"bastion.guard {name}",
                                                attributes={"bastion.stage": name}, record_exception=False,
                                                set_status_on_exception=False) as span:
            try:
                yield
            except BaseException as exc:
                # A guard that stops a call is doing its job: the span says why, its status stays unset; the
                # request span carries the decision.
                span.set_attribute("bastion.stopped", True)
                span.set_attribute("error.type", type(exc).__name__)
                raise

    def forward(self, upstream: str, method: str,
                params: dict[str, Any]) -> AbstractContextManager[dict[str, Any]]:
        if not trace.get_current_span().is_recording():
            # Unsampled: no client span, but the upstream still joins the trace (with the sampled flag off).
            return Same(self._with_context(params))
        return self._forward(upstream, method, params)

    def _with_context(self, params: dict[str, Any]) -> dict[str, Any]:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        if not carrier:
            return params
        meta = params.get("_meta")
        return {**params, "_meta": {**(meta if isinstance(meta, Mapping) else {}), **carrier}}

    @contextmanager
    def _forward(self, upstream: str, method: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        field = _TARGET_FIELD.get(method)
        target = params.get(field) if field is not None else None
        attrs: dict[str, str] = {"mcp.method.name": method, "bastion.upstream": upstream,
                                 "jsonrpc.protocol.version": "2.0"}
        if method == "tools/call" and isinstance(target, str):
            attrs["gen_ai.tool.name"] = target
            attrs["gen_ai.operation.name"] = "execute_tool"
        name = f"{method} {target}" if isinstance(target, str) else method
        with self._tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attrs, record_exception=False,
                                                set_status_on_exception=False) as span:
            try:
                yield self._with_context(params)
            except BaseException as exc:
                _error_attributes(span, exc)
                raise

    def call_outcome(self, ctx: CallContext, record: CallRecord, outcome: str) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        span.set_attribute("bastion.call_id", ctx.request_id)
        span.set_attribute("bastion.outcome", outcome)
        span.set_attribute("bastion.decision", record.decision)
        span.set_attribute("bastion.stage", record.stage)
        if ctx.tool.upstream:
            span.set_attribute("bastion.upstream", ctx.tool.upstream)
        if record.rule_id is not None:
            span.set_attribute("bastion.rule_id", record.rule_id)
        if record.limit is not None:
            span.set_attribute("bastion.limit", record.limit)
        if outcome != "allowed":
            span.set_attribute("error.type", outcome)
            span.set_status(Status(StatusCode.ERROR, record.reason or outcome))
        elif record.extra.get("upstream_is_error"):
            # The tool ran and reported failure (CallToolResult.isError): the GenAI convention's tool_error.
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, "tool reported an error"))

    def traceparent(self) -> str | None:
        ctx = trace.get_current_span().get_span_context()
        if not ctx.is_valid:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def shutdown(self) -> None:
        self._provider.shutdown()
