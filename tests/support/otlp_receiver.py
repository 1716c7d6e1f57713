"""A real OTLP/HTTP trace receiver for tests: ``python -m tests.support.otlp_receiver --port N --out FILE``.

Accepts ``POST /v1/traces`` (binary protobuf, optionally gzip), decodes it with the official ``opentelemetry-proto``
classes, and appends one JSON line per span to FILE: ids in hex, kind and status as names, attributes as plain
values, the resource's ``service.name``. Anything else gets a 404/415, so an exporter misconfiguration shows up as
missing spans plus an error in the gateway's log, not as silently accepted garbage.
"""

from __future__ import annotations

import argparse
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind) if kind else None


def span_json(span: Span, service: Any, scope: str) -> dict[str, Any]:
    return {
        "service": service,
        "scope": scope,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex() or None,
        "trace_state": span.trace_state or None,
        "name": span.name,
        "kind": Span.SpanKind.Name(span.kind),
        "start_ns": span.start_time_unix_nano,
        "end_ns": span.end_time_unix_nano,
        "attributes": {kv.key: any_value(kv.value) for kv in span.attributes},
        "status": Status.StatusCode.Name(span.status.code),
    }


def spans_of(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    out = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            out.extend(span_json(span, resource.get("service.name"), scope_spans.scope.name)
                       for span in scope_spans.spans)
    return out


def make_handler(out: Path, lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            if not self.headers.get("Content-Type", "").startswith("application/x-protobuf"):
                self.send_error(415)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            lines = [json.dumps({**span, "headers": {"x-test": self.headers.get("x-test")}})
                     for span in spans_of(request)]
            with lock, out.open("a", encoding="utf-8") as fh:
                fh.writelines(line + "\n" for line in lines)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args.out, threading.Lock()))
    server.serve_forever()


if __name__ == "__main__":
    main()
