"""Fuzzing the front door over real sockets (hypothesis, bounded): malformed HTTP, malformed JSON-RPC, and
well-formed calls with arbitrary arguments, against a bastion process.

What must hold whatever arrives: no 5xx (but the deliberate 501 refusals), no traceback in the gateway's stderr,
exactly one audit record per ``tools/call`` request that reached the call pipeline, and the gateway still serves
afterwards.

"Reached the pipeline" is decided by bastion's own JSON parsing and message classification (``jsonrpc.loads``,
``jsonrpc.classify``), so the oracle follows the parser as it evolves: a request whose body parses, that is a
JSON-RPC request for ``tools/call`` with a string ``name`` and object (or absent) ``arguments``.

Bounds: ``FUZZ_EXAMPLES`` examples per strategy (default 60), request deadline 0.5 s in the gateway, 3 s per
exchange; the module runs in about 30-40 s on two cores
(shared), most of it in requests the gateway has to time out.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bastion import jsonrpc
from bastion.errors import ProtocolError
from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.raw_http import RawResponse, build, exchange
from tests.support.rpc import RpcClient

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
V = "2026-07-28"
# No shrinking: every example costs a round trip (up to seconds for a request the gateway must time out), and a
# failure is reported with the example that failed, which is already small.
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("fuzz")
    process = GatewayProcess({
        "auth": "none",
        "listen": {"request_timeout": "500ms", "keep_alive_timeout": "1s", "max_body_size": "64KiB"},
        "upstreams": {"basic": stdio_upstream("tests.fixtures.basic_server")},
    }, workdir).start()
    yield process
    err = process.stderr()
    code = process.stop()
    assert code == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "Exception in ASGI application" not in err, err[-3000:]


@pytest.fixture(scope="module")
def session_id(gw: GatewayProcess) -> Iterator[str]:
    client = RpcClient(gw.url, headers={"Accept": "application/json"})
    client.initialize()
    assert client.session_id is not None
    yield client.session_id
    client.close()


class Ledger:
    """Counts the tools/call requests that must each leave one audit record."""

    def __init__(self, gw: GatewayProcess) -> None:
        self.gw = gw
        self.start = len(gw.records("tool.call"))
        self.expected = 0

    def settle(self, timeout: float = 15.0) -> int:
        """Records written since the start, once the expected number is there (or at the timeout). Returns at
        once when they are; the timeout only matters on a machine so loaded that the audit write lags."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = len(self.gw.records("tool.call")) - self.start
            if found >= self.expected:
                break
            time.sleep(0.02)
        return len(self.gw.records("tool.call")) - self.start


def send(gw: GatewayProcess, raw: bytes, timeout: float = 3.0) -> RawResponse:
    return asyncio.run(exchange(gw.port, raw, timeout=timeout))


def assert_no_5xx(response: RawResponse, raw: bytes) -> None:
    """No server error. The one 5xx allowed is bastion's deliberate 501 for what HTTP says a server that does
    not implement it must answer so (a transfer coding other than chunked, an unknown method), with its body."""
    if response.status == 501:
        assert response.json()["error"]["message"].startswith("Not Implemented"), (response, raw[:500])
        return
    assert response.status is None or response.status < 500, (response, raw[:500])


def expected_call(body: bytes) -> tuple[int, int | None]:
    """How many tool.call records ``body`` (POSTed in a 2025-11-25 session without modern headers) must leave,
    and the status it must get. Every readable ``tools/call`` request is a call (docs/audit.md): refused at parse
    time (400, still recorded), malformed params or an unknown tool (200), run through the pipeline (200), or
    refused by the front door before dispatch (still recorded): a 2026-07-28 ``_meta`` sends it down the modern
    path, whose header checks refuse it (400), and a batch is refused whole in this revision (400), each call in
    it recorded."""
    try:
        doc = jsonrpc.parse(body)
    except ProtocolError:
        return 0, None
    if isinstance(doc.value, list):
        return sum(_is_call(doc, item) for item in doc.value), 400
    obj = doc.value
    if not _is_call(doc, obj):
        return 0, None
    try:
        msg = jsonrpc.classify(obj, doc.flaw(obj))
    except ProtocolError:
        return 1, 400
    meta = msg.params.get("_meta")
    if isinstance(meta, dict) and "io.modelcontextprotocol/protocolVersion" in meta:
        return 1, 400
    return 1, 200


def _is_call(doc: Any, item: object) -> bool:
    """Whether a message is a tools/call request as the front door's audit sees it: a readable one, or one the
    parser refused that still carries an id (``Responder.audit_rejected``)."""
    if not isinstance(item, dict) or item.get("method") != "tools/call" or "id" not in item:
        return False
    try:
        msg = jsonrpc.classify(item, doc.flaw(item))
    except ProtocolError:
        return True
    return msg.kind == "request"


def assert_still_serves(gw: GatewayProcess, session: str) -> None:
    payload = json.dumps({"jsonrpc": "2.0", "id": "alive", "method": "tools/call",
                          "params": {"name": "basic__echo", "arguments": {"message": "still here"}}}).encode()
    response = send(gw, build("POST", "/mcp", [("Host", "127.0.0.1"), ("Content-Type", "application/json"),
                                               ("Accept", "application/json"), ("Mcp-Session-Id", session)],
                              payload))
    assert response.status == 200, response
    assert response.json()["result"]["content"][0]["text"] == "still here"
    assert httpx.get(gw.base + "/readyz", timeout=5).status_code == 200


# -- strategies -----------------------------------------------------------------------------------------------

TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
KNOWN_HEADERS = ["Host", "Origin", "Content-Type", "Content-Length", "Transfer-Encoding", "Authorization",
                 "Mcp-Session-Id", "MCP-Protocol-Version", "Mcp-Method", "Mcp-Name", "Accept", "Connection",
                 "Expect", "Upgrade", "Last-Event-ID", "traceparent"]
INTERESTING_VALUES = ["", " ", "\t", "application/json", "application/json; charset=latin-1", "text/plain",
                      "chunked", "gzip, chunked", "chunked, chunked", "identity", "0", "-1", "99999999999",
                      "100-continue", "close", "keep-alive", "websocket", "h2c", "localhost", "127.0.0.1:1",
                      "localhost:1.attacker.example", "http://localhost:1.attacker.example", "null",
                      "http://[::1]:80", "Bearer x", "2025-11-25", V, "tools/call", "=?base64?AAA?=",
                      "a" * 9000]

header_values = st.one_of(st.sampled_from(INTERESTING_VALUES), st.text(max_size=40),
                          st.text(alphabet=" \t\x00\x01\x7f\r\nabc:;,=\"", max_size=10))
header_names = st.one_of(st.sampled_from(KNOWN_HEADERS), st.text(alphabet=TOKEN, min_size=1, max_size=20),
                         st.text(max_size=8))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25)
ids = st.one_of(st.integers(min_value=-(2**53), max_value=2**53), st.text(max_size=12), st.none(),
                st.booleans(), st.floats(allow_nan=False, allow_infinity=False), st.integers())
tool_names = st.one_of(st.sampled_from(["basic__echo", "basic__add", "basic__fail", "basic__whoami", "echo", ""]),
                       st.text(max_size=30))
calls = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "id": ids, "method": st.just("tools/call")},
    optional={"params": st.one_of(
        st.fixed_dictionaries({"name": tool_names}, optional={"arguments": st.one_of(
            st.dictionaries(st.text(max_size=10), json_values, max_size=6), json_values)}),
        json_values)})
good_calls = st.fixed_dictionaries({
    "jsonrpc": st.just("2.0"),
    "id": st.one_of(st.integers(min_value=-(2**53), max_value=2**53), st.text(max_size=12)),
    "method": st.just("tools/call"),
    "params": st.fixed_dictionaries({"name": tool_names},
                                    optional={"arguments": st.dictionaries(st.text(max_size=10), json_values,
                                                                           max_size=6)})})
messages = st.one_of(
    calls,
    st.fixed_dictionaries({"jsonrpc": st.sampled_from(["2.0", "1.0", 2.0]), "id": ids,
                           "method": st.one_of(st.sampled_from(["tools/list", "ping", "tools/call",
                                                                "resources/read", "initialize", ""]),
                                               st.text(max_size=15))},
                          optional={"params": json_values}),
    json_values,
    st.lists(calls, max_size=3),
)


def encode(doc: Any) -> bytes:
    return json.dumps(doc).encode("utf-8", "surrogatepass")


bodies = st.one_of(messages.map(encode), st.binary(max_size=200),
                   messages.map(encode).map(lambda b: b[: max(1, len(b) // 2)]))


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "DELETE", "PUT", "OPTIONS", "HEAD", "BREW",
                                   "G\x00T", "", "POST POST", "\x16\x03\x01"]))
    target = draw(st.one_of(st.sampled_from(["/mcp", "/mcp?x=1", "*", "/healthz", "/metrics", "/mcp/",
                                             "/mcp?" + "q" * 9000, "http://evil/mcp", "/%00", "/m cp"]),
                            st.text(max_size=30).map(lambda t: "/" + t)))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.x", "", "http/1.1"]))
    headers = [("Host", "127.0.0.1")] if draw(st.booleans()) else []
    headers += draw(st.lists(st.tuples(header_names, header_values), max_size=12))
    body = draw(bodies)
    mode = draw(st.sampled_from(["exact", "exact", "none", "short", "long"]))
    if mode != "none" and not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in headers):
        length = {"exact": len(body), "short": max(0, len(body) - 3), "long": len(body) + 10}[mode]
        headers.append(("Content-Length", str(length)))
    return build(method, target, headers, body, content_length=False, version=version)


# -- the properties -------------------------------------------------------------------------------------------


def test_malformed_http_never_gets_a_5xx(gw: GatewayProcess, session_id: str) -> None:
    ledger = Ledger(gw)
    sent: list[bytes] = []

    @FUZZ
    @given(raw=raw_requests())
    def run(raw: bytes) -> None:
        sent.append(raw)
        assert_no_5xx(send(gw, raw), raw)

    run()
    # These requests carry no session and no modern envelope, so none may have reached the call pipeline.
    assert ledger.settle(timeout=0.5) == 0
    assert_still_serves(gw, session_id)
    assert len(sent) >= min(EXAMPLES, 10)


def test_arbitrary_json_rpc_in_a_session_gets_one_audit_record_per_call(gw: GatewayProcess,
                                                                        session_id: str) -> None:
    ledger = Ledger(gw)

    @FUZZ
    @given(body=st.one_of(good_calls.map(encode), bodies),
           accept=st.sampled_from(["application/json", "application/json, text/event-stream"]),
           ows=st.sampled_from(["", " ", "\t ", "  "]))
    def run(body: bytes, accept: str, ows: str) -> None:
        headers = [("Host", "127.0.0.1"), ("Content-Type", "application/json"), ("Accept", accept),
                   ("Mcp-Session-Id", f"{ows}{session_id}{ows}"), ("MCP-Protocol-Version", "2025-11-25")]
        raw = build("POST", "/mcp", headers, body)
        response = send(gw, raw)
        assert_no_5xx(response, raw)
        recorded, status = expected_call(body)
        if recorded or status is not None:
            ledger.expected += recorded
            assert response.status == status, (response, body[:300])
        found = ledger.settle()
        assert found == ledger.expected, (found, ledger.expected, response, body[:300])

    run()
    time.sleep(0.3)
    assert ledger.settle(timeout=0.1) == ledger.expected
    assert ledger.expected > 0
    assert_still_serves(gw, session_id)


def test_modern_calls_with_arbitrary_arguments_and_header_spacing(gw: GatewayProcess, session_id: str) -> None:
    """2026-07-28 requests: mirrored headers with optional whitespace and case changes must be accepted; a
    corrupted mirror is refused (400) before the pipeline; each call, accepted or refused, leaves one record."""
    ledger = Ledger(gw)

    @FUZZ
    @given(name=tool_names, arguments=st.dictionaries(st.text(max_size=10), json_values, max_size=6),
           rid=st.one_of(st.integers(min_value=0, max_value=2**31), st.text(min_size=1, max_size=8)),
           ows=st.tuples(st.sampled_from(["", " ", "\t", " \t "]), st.sampled_from(["", " ", "\t", " \t "])),
           upper=st.booleans(), corrupt=st.booleans())
    def run(name: str, arguments: dict[str, Any], rid: Any, ows: tuple[str, str], upper: bool,
            corrupt: bool) -> None:
        params = {"name": name, "arguments": arguments,
                  "_meta": {"io.modelcontextprotocol/protocolVersion": V,
                            "io.modelcontextprotocol/clientCapabilities": {}}}
        body = encode({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})
        mirrored = request_headers("tools/call", params, V, None)
        headers = [("Host", "127.0.0.1"), ("Content-Type", "application/json"), ("Accept", "application/json")]
        for key, value in mirrored.items():
            if corrupt and key.lower() == "mcp-name":
                value = value + "x"
            headers.append((key.upper() if upper else key, f"{ows[0]}{value}{ows[1]}"))
        raw = build("POST", "/mcp", headers, body)
        response = send(gw, raw)
        assert_no_5xx(response, raw)
        doc = jsonrpc.parse(body)
        flaw = doc.flaw(doc.value)
        if flaw is not None:
            # Values no peer can take (integers beyond ±(2^53-1), lone surrogates, too deep) are refused at parse
            # time, before the header check, with the id; the call still leaves its record.
            ledger.expected += 1
            assert response.status == 400, response
            assert response.json()["error"]["code"] == (-32600 if flaw.path[:1] == ("id",) else -32602)
        elif corrupt:
            # Refused by the header check, before the pipeline; still a call, with its record.
            ledger.expected += 1
            assert response.status == 400, response
            assert response.json()["error"]["code"] == -32020
        else:
            ledger.expected += 1
            assert response.status == 200, (response, body[:300])
            assert response.json()["id"] == rid
        found = ledger.settle()
        assert found == ledger.expected, (found, ledger.expected, response, body[:300])

    run()
    assert ledger.expected > 0
    assert_still_serves(gw, session_id)
