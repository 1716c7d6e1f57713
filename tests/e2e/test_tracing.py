"""OpenTelemetry tracing end to end: a real gateway process exports over OTLP/HTTP to a real receiver process
(which decodes the protobuf with ``opentelemetry-proto``), in front of a real HTTP upstream that reports the
headers it received. The span tree, the W3C continuation from the client, the propagation to the upstream and the
trace id in the audit records are asserted on what those processes wrote."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import LEGACY, stdio_upstream
from tests.support.fixture_server import FixtureServer
from tests.support.gateway import REPO, GatewayProcess
from tests.support.net import free_port, wait_for_port
from tests.support.rpc import RpcClient

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
META_TRACE = "0af7651916cd43dd8448eb211c80319c"
META_SPAN = "b7ad6b7169203331"
POLICY = """\
version: 1
rules:
  - id: everyone-web
    effect: allow
    upstreams: [web, basic]
  - id: no-add
    effect: deny
    tools: [basic__add]
"""


class Receiver:
    def __init__(self, out: Path) -> None:
        self.port = free_port()
        self.out = out
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.otlp_receiver", "--port", str(self.port),
                                      "--out", str(out)], cwd=REPO)
        wait_for_port(self.port)

    def spans(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def trace(self, trace_id: str, *, at_least: int, timeout: float = 15.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            found = [s for s in self.spans() if s["trace_id"] == trace_id]
            # The request span ends last, so once it is in, every span of the request is (the batch processor
            # exports in the order spans end).
            done = any(s["kind"] == "SPAN_KIND_SERVER" for s in found) and len(found) >= at_least
            if done or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    r = Receiver(tmp_path_factory.mktemp("otlp") / "spans.jsonl")
    yield r
    r.stop()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, http_fixture: FixtureServer,
           receiver: Receiver) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("traced")
    (workdir / "policy.yaml").write_text(POLICY)
    gw = GatewayProcess({
        "auth": "none",
        "policies": str(workdir / "policy.yaml"),
        "tracing": {"otlp_endpoint": f"http://127.0.0.1:{receiver.port}", "service_name": "bastion-e2e",
                    "sample_ratio": 1.0, "headers": {"x-test": "from-config"}},
        "upstreams": {"web": {"url": http_fixture.url, **LEGACY}, "basic": stdio_upstream()},
    }, workdir, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
    yield gw
    gw.stop()


def _traceparent(trace_id: str, span_id: str, flags: str = "01") -> str:
    return f"00-{trace_id}-{span_id}-{flags}"


def _by_name(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    matches = [s for s in spans if s["name"] == name]
    assert len(matches) == 1, (name, [s["name"] for s in spans])
    return matches[0]


def _call(client: RpcClient, name: str, arguments: dict[str, Any], *, meta: dict[str, Any] | None = None,
          headers: dict[str, str] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    r = client.post({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}, headers=headers)
    from tests.support.rpc import parse_body
    return next(m for m in parse_body(r) if m.get("id") == 7)


def test_span_tree_continues_the_client_trace_and_reaches_the_upstream(traced: GatewayProcess,
                                                                       receiver: Receiver) -> None:
    client = RpcClient(traced.url)
    client.initialize()
    answer = _call(client, "web__whoami", {}, headers={"traceparent": _traceparent(CLIENT_TRACE, CLIENT_SPAN),
                                                       "tracestate": "vendor=abc"})
    received = answer["result"]["structuredContent"]
    spans = receiver.trace(CLIENT_TRACE, at_least=7)

    server = _by_name(spans, "tools/call web__whoami")
    assert server["kind"] == "SPAN_KIND_SERVER"
    assert server["parent_span_id"] == CLIENT_SPAN  # continued from the client's HTTP header
    assert server["service"] == "bastion-e2e"
    attrs = server["attributes"]
    assert attrs["mcp.method.name"] == "tools/call"
    assert attrs["gen_ai.tool.name"] == "web__whoami"
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["jsonrpc.request.id"] == "7"
    assert attrs["mcp.session.id"] == client.session_id
    assert attrs["mcp.protocol.version"] == "2025-11-25"
    assert attrs["bastion.principal.id"] == "anonymous"
    assert attrs["bastion.decision"] == "allow"
    assert attrs["bastion.outcome"] == "allowed"
    assert attrs["bastion.rule_id"] == "everyone-web"
    assert attrs["bastion.upstream"] == "web"
    assert server["status"] == "STATUS_CODE_UNSET"
    assert server["trace_state"] == "vendor=abc"

    children = [s for s in spans if s["parent_span_id"] == server["span_id"]]
    names = [s["name"] for s in sorted(children, key=lambda s: s["start_ns"])]
    assert "bastion.guard policy" in names and "bastion.guard ratelimit" in names
    assert "bastion.guard input_schema" in names and "bastion.guard sanitize" in names
    assert names.index("bastion.guard policy") < names.index("bastion.forward") < names.index("bastion.guard sanitize")
    for child in children:
        assert child["kind"] == "SPAN_KIND_INTERNAL"
        assert server["start_ns"] <= child["start_ns"] <= child["end_ns"] <= server["end_ns"]
    forward = _by_name(children, "bastion.forward")
    upstream_call = _by_name(spans, "tools/call whoami")
    assert upstream_call["kind"] == "SPAN_KIND_CLIENT"
    assert upstream_call["parent_span_id"] == forward["span_id"]
    assert upstream_call["attributes"]["bastion.upstream"] == "web"

    # The HTTP upstream got bastion's client span as its parent, in the W3C headers, and the client's tracestate.
    assert received["traceparent"] == _traceparent(CLIENT_TRACE, upstream_call["span_id"])
    assert received["tracestate"] == "vendor=abc"
    # The exporter sent the configured headers.
    assert server["headers"]["x-test"] == "from-config"

    record = next(r for r in traced.wait_records("tool.call", 1) if r["tool"]["name"] == "web__whoami")
    assert record["trace"] == {"trace_id": CLIENT_TRACE, "span_id": server["span_id"], "sampled": True}
    client.close()


def test_meta_trace_context_wins_over_the_header(traced: GatewayProcess, receiver: Receiver) -> None:
    client = RpcClient(traced.url)
    client.initialize()
    other = "11111111111111111111111111111111"
    answer = _call(client, "web__whoami", {},
                   meta={"traceparent": _traceparent(META_TRACE, META_SPAN)},
                   headers={"traceparent": _traceparent(other, CLIENT_SPAN)})
    spans = receiver.trace(META_TRACE, at_least=7)
    server = _by_name(spans, "tools/call web__whoami")
    assert server["parent_span_id"] == META_SPAN
    assert answer["result"]["structuredContent"]["traceparent"].startswith(f"00-{META_TRACE}-")
    assert not [s for s in receiver.spans() if s["trace_id"] == other]
    client.close()


def test_denied_call_and_new_trace_without_client_context(traced: GatewayProcess, receiver: Receiver) -> None:
    client = RpcClient(traced.url)
    client.initialize()
    answer = _call(client, "basic__add", {"a": 1, "b": 2})
    code = answer["error"]["code"]  # a policy denial is a JSON-RPC error (docs/errors.md)
    record = next(r for r in traced.wait_records("tool.call", 1) if r["tool"]["name"] == "basic__add")
    trace_id = record["trace"]["trace_id"]
    spans = receiver.trace(trace_id, at_least=2)
    server = _by_name(spans, "tools/call basic__add")
    assert server["parent_span_id"] is None  # a new trace: the client sent no context
    assert server["span_id"] == record["trace"]["span_id"]
    attrs = server["attributes"]
    assert attrs["bastion.decision"] == "deny"
    assert attrs["bastion.rule_id"] == "no-add"
    assert attrs["bastion.stage"] == "policy"
    assert attrs["bastion.outcome"] == "denied"
    # The MCP convention: a JSON-RPC error response sets both to its code.
    assert attrs["error.type"] == attrs["rpc.response.status_code"] == str(code)
    assert server["status"] == "STATUS_CODE_ERROR"
    policy = _by_name(spans, "bastion.guard policy")
    assert policy["attributes"]["bastion.stopped"] is True
    assert not [s for s in spans if s["name"] == "bastion.forward"]  # a denied call never reaches the upstream
    client.close()


def test_protocol_error_and_other_methods_are_spanned(traced: GatewayProcess, receiver: Receiver) -> None:
    client = RpcClient(traced.url)
    client.initialize()
    trace_id = "22222222222222222222222222222222"
    r = client.post({"jsonrpc": "2.0", "id": 9, "method": "resources/read", "params": {"uri": "nope://x"}},
                    headers={"traceparent": _traceparent(trace_id, CLIENT_SPAN)})
    assert r.status_code == 200
    tools = client.post({"jsonrpc": "2.0", "id": 10, "method": "tools/list"},
                        headers={"traceparent": _traceparent(trace_id, CLIENT_SPAN)})
    assert tools.status_code == 200
    spans = receiver.trace(trace_id, at_least=2)
    read = _by_name(spans, "resources/read")
    assert read["attributes"]["rpc.response.status_code"] == "-32602"
    assert read["attributes"]["error.type"] == "-32602"
    assert read["status"] == "STATUS_CODE_ERROR"
    listed = _by_name(spans, "tools/list")
    assert listed["status"] == "STATUS_CODE_UNSET"
    record = next(r for r in traced.wait_records("tools.list", 1) if r.get("request_id") == 10)
    assert record["trace"]["span_id"] == listed["span_id"]
    client.close()


def test_unsampled_client_trace_makes_no_spans_but_still_propagates(traced: GatewayProcess,
                                                                     receiver: Receiver) -> None:
    """Parent-based sampling: a client's sampled=0 is honoured (no spans, not even children), and the upstream and
    the audit record still join the client's trace."""
    client = RpcClient(traced.url)
    client.initialize()
    trace_id = "33333333333333333333333333333333"
    answer = _call(client, "web__whoami", {}, meta={"traceparent": _traceparent(trace_id, CLIENT_SPAN, "00")})
    received = answer["result"]["structuredContent"]["traceparent"]
    assert received.startswith(f"00-{trace_id}-") and received.endswith("-00")
    assert received.split("-")[2] != CLIENT_SPAN  # bastion's own (unrecorded) span id, not the client's
    record = next(r for r in traced.wait_records("tool.call", 1)
                  if r["trace"] is not None and r["trace"]["trace_id"] == trace_id)
    assert record["trace"]["sampled"] is False
    assert record["trace"]["span_id"] == received.split("-")[2]
    # A later sampled call's spans have been exported by now; none of this trace's are among them.
    marker = "44444444444444444444444444444444"
    _call(client, "web__whoami", {}, meta={"traceparent": _traceparent(marker, CLIENT_SPAN)})
    assert receiver.trace(marker, at_least=7)
    assert not [s for s in receiver.spans() if s["trace_id"] == trace_id]
    client.close()


def test_calls_refused_before_the_pipeline_carry_the_trace_too(traced: GatewayProcess, receiver: Receiver) -> None:
    client = RpcClient(traced.url)
    client.initialize()
    trace_id = "55555555555555555555555555555555"
    answer = _call(client, "no_such_tool", {}, headers={"traceparent": _traceparent(trace_id, CLIENT_SPAN)})
    assert "error" in answer
    spans = receiver.trace(trace_id, at_least=1)
    server = _by_name(spans, "tools/call no_such_tool")
    assert server["attributes"]["rpc.response.status_code"] == str(answer["error"]["code"])
    record = next(r for r in traced.wait_records("tool.call", 1) if r["tool"]["name"] == "no_such_tool")
    assert record["trace"] == {"trace_id": trace_id, "span_id": server["span_id"], "sampled": True}
    client.close()
