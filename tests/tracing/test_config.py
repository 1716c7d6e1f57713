"""The tracing section, the on/off rule, the no-op path, and the header mirror of ``_meta`` trace context."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bastion.errors import ConfigError
from bastion.tracing import NO_TRACING, TracingConfig, build_tracing
from bastion.upstream.httpio import trace_headers

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_absent_block_is_off_unless_an_otel_endpoint_variable_is_set() -> None:
    cfg = TracingConfig.from_mapping(None, "tracing")
    assert build_tracing(cfg, {}) is NO_TRACING
    assert cfg.active({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert cfg.active({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not cfg.active({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})


def test_block_turns_it_on_and_enabled_false_off() -> None:
    assert TracingConfig.from_mapping({}, "tracing").active({})
    assert not TracingConfig.from_mapping({"enabled": False}, "tracing").active({"OTEL_EXPORTER_OTLP_ENDPOINT": "x"})
    assert not TracingConfig.from_mapping({}, "tracing").active({"OTEL_SDK_DISABLED": "TRUE"})


def test_fields_parse_with_bare_endpoints_completed() -> None:
    cfg = TracingConfig.from_mapping({"otlp_endpoint": "http://collector:4318", "service_name": "gw",
                                      "sample_ratio": 0.01, "headers": {"authorization": "Bearer x"}}, "tracing")
    assert cfg.otlp_endpoint == "http://collector:4318/v1/traces"
    assert cfg.sample_ratio == 0.01 and cfg.service_name == "gw" and cfg.headers == {"authorization": "Bearer x"}
    assert TracingConfig.from_mapping({"otlp_endpoint": "https://c/otlp/v1/traces"}, "t").otlp_endpoint == \
        "https://c/otlp/v1/traces"


@pytest.mark.parametrize(("data", "where"), [
    ({"sample_ratio": 1.5}, "tracing.sample_ratio"),
    ({"sample_ratio": True}, "tracing.sample_ratio"),
    ({"otlp_endpoint": "collector:4318"}, "tracing.otlp_endpoint"),
    ({"service_name": ""}, "tracing.service_name"),
    ({"headers": {"a": 1}}, "tracing.headers"),
    ({"enabled": "yes"}, "tracing.enabled"),
    ({"endpoint": "http://c"}, "tracing.endpoint"),
])
def test_bad_values_name_their_key(data: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError) as info:
        TracingConfig.from_mapping(data, "tracing")
    assert info.value.path == where


def test_off_never_imports_the_sdk() -> None:
    # Not "no opentelemetry at all": redis-py loads the OTel metrics API when it is installed. What tracing adds,
    # the trace SDK, the exporter and bastion's own adapter, stays out of an untraced gateway.
    code = ("import sys; from bastion.app import create_app; from bastion.settings import loads; "
            "create_app(loads('upstreams: {a: {url: \"http://127.0.0.1:9/mcp\"}}\\nauth: none\\n')); "
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk.trace', "
            "'opentelemetry.exporter', 'bastion.tracing.otel'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_trace_headers_mirror_only_well_formed_context() -> None:
    def msg(meta: object) -> dict[str, object]:
        return {"method": "tools/call", "params": {"name": "x", "_meta": meta}}

    assert trace_headers(msg({"traceparent": TP, "tracestate": "a=1"})) == {"traceparent": TP, "tracestate": "a=1"}
    assert trace_headers(msg({"traceparent": "garbage", "tracestate": "a=1"})) == {}
    assert trace_headers(msg({"traceparent": TP, "tracestate": "a=1\r\nX-Evil: 1"})) == {"traceparent": TP}
    assert trace_headers(msg({"traceparent": "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-\rX"})) == {}
    assert trace_headers(msg(None)) == {}
    assert trace_headers({"method": "ping"}) == {}
