"""The front door's HTTP strictness end to end: bastion as a process, raw sockets where HTTP libraries would not
send what an attacker does, and what operators see (metrics, ``http.refused`` audit records, logs)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.raw_http import build, exchange
from tests.support.rpc import RpcClient

V = "2026-07-28"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("front")
    process = GatewayProcess({
        "auth": "none",
        "listen": {"request_timeout": "1s", "max_body_size": "64KiB", "max_header_size": "8KiB",
                   "max_target_size": "2KiB", "refusal_audit": {"burst": 3, "per_minute": 1}},
        "upstreams": {"basic": stdio_upstream("tests.fixtures.basic_server")},
    }, workdir, env={"BASTION_LOG_LEVEL": "debug"}).start()
    yield process
    process.stop()


def refusals(gw: GatewayProcess) -> dict[str, float]:
    text = httpx.get(gw.base + "/metrics", timeout=10).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^bastion_http_refusals_total\{reason="([a-z_]+)"\} (\S+)$', text, re.M)}


def refused_records(gw: GatewayProcess, reason: str) -> list[dict[str, Any]]:
    return [r for r in gw.records("http.refused") if r["reason"] == reason]


def json_post(body: Any, *extra: tuple[str, str], content_type: str = "application/json") -> list[tuple[str, str]]:
    return [("Host", "127.0.0.1"), ("Content-Type", content_type), ("Accept", "application/json"),
            ("Connection", "close"), *extra]


def session(gw: GatewayProcess) -> RpcClient:
    client = RpcClient(gw.url, headers={"Accept": "application/json"})
    client.initialize()
    return client


def body(method: str, params: dict[str, Any] | None = None, rid: int = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}).encode()


async def test_refusals_before_authentication_are_counted_audited_and_answered(gw: GatewayProcess) -> None:
    before = refusals(gw)
    ping = body("ping")
    cases = [
        (build("POST", "/mcp", [*json_post(ping), ("Origin", "http://localhost:1.attacker.example")], ping), 403,
         "origin"),
        (build("POST", "/mcp", [("Host", "attacker.example:8080"), ("Content-Type", "application/json")], ping),
         421, "host"),
        (build("POST", "/mcp", json_post(ping, content_type="text/plain"), ping), 415, "content_type"),
        (build("POST", "/mcp", [*json_post(ping), ("Authorization", "Bearer a"), ("authorization", "Bearer b")],
               ping), 400, "duplicate_header"),
        (build("POST", "/mcp", [*json_post(ping), ("Content-Length", "70000")]), 413, "body_too_large"),
        (build("POST", "/mcp?" + "q" * 3000, json_post(ping), ping), 414, "uri_too_long"),
        (build("POST", "/mcp", [*json_post(ping), *((f"X-{i}", "v" * 200) for i in range(50))], ping), 431,
         "header_too_large"),
        (build("POST", "/mcp", [*json_post(ping), ("Transfer-Encoding", "gzip, chunked")], b"0\r\n\r\n"), 501,
         "transfer_encoding"),
    ]
    for raw, status, reason in cases:
        response = await exchange(gw.port, raw)
        assert response.status == status, (reason, response)
        if status != 421:
            assert response.json()["error"]["message"], reason
    for _ in range(4):  # a flood of one reason: every refusal counted, records capped by the bucket (burst 3)
        response = await exchange(gw.port, cases[0][0])
        assert response.status == 403
    after = refusals(gw)
    for _, _, reason in cases:
        expected = 5 if reason == "origin" else 1
        assert after.get(reason, 0) - before.get(reason, 0) == expected, reason
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(refused_records(gw, "transfer_encoding")) < 1:
        await asyncio.sleep(0.05)
    assert len(refused_records(gw, "origin")) == 3
    for _, status, reason in cases:
        record = refused_records(gw, reason)[0]
        assert record["status"] == status
        assert record["remote_addr"] == "127.0.0.1"
        assert record["principal"] is None
    origin = refused_records(gw, "origin")[0]
    assert origin["detail"] == "origin=http://localhost:1.attacker.example"
    assert (origin["method"], origin["path"]) == ("POST", "/mcp")
    assert "Traceback" not in gw.stderr()


async def test_a_slow_client_gets_408_and_is_audited(gw: GatewayProcess) -> None:
    before = refusals(gw).get("request_timeout", 0)
    response = await exchange(gw.port, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"Content-Type: app",
                              pause=0.3, timeout=5)
    assert response.status == 408
    head = build("POST", "/mcp", json_post(b""), content_length=False)
    response = await exchange(gw.port, head.replace(b"\r\n\r\n", b"\r\nContent-Length: 50\r\n\r\n"), b"{\"jsonrpc\"",
                              pause=0.2, timeout=5)
    assert response.status == 408
    assert refusals(gw)["request_timeout"] - before == 2


async def test_header_values_are_compared_without_their_optional_whitespace(gw: GatewayProcess) -> None:
    """SEP-2243 conformance check ``sep-2243-server-accepts-whitespace-header-value``, over a raw socket."""
    params = {"name": "basic__echo", "arguments": {"message": "hi"},
              "_meta": {"io.modelcontextprotocol/protocolVersion": V,
                        "io.modelcontextprotocol/clientCapabilities": {}}}
    payload = body("tools/call", params, rid=7)
    mirrored = [(k, f"  {v}\t ") for k, v in request_headers("tools/call", params, V, None).items()]
    response = await exchange(gw.port, build("POST", "/mcp", [*json_post(payload), *mirrored], payload))
    assert response.status == 200, response
    assert response.json()["result"]["content"][0]["text"] == "hi"


async def test_duplicate_mcp_headers_are_400_never_first_one_wins(gw: GatewayProcess) -> None:
    client = session(gw)
    payload = body("tools/list")
    sid = client.session_id
    assert sid is not None
    for extra in ([("Mcp-Session-Id", sid), ("Mcp-Session-Id", "forged")],
                  [("Mcp-Session-Id", sid), ("MCP-Protocol-Version", "2025-11-25"),
                   ("Mcp-Protocol-Version", "2025-11-25")],
                  [("Mcp-Session-Id", sid), ("Origin", "http://localhost"), ("Origin", "http://localhost")]):
        response = await exchange(gw.port, build("POST", "/mcp", [*json_post(payload), *extra], payload))
        assert response.status == 400, extra
        assert "more than once" in response.json()["error"]["message"]
    client.close()


async def test_a_client_that_leaves_mid_body_is_a_debug_line_not_a_traceback(gw: GatewayProcess) -> None:
    before = gw.stderr().count("http.client_disconnected")
    _reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    head = build("POST", "/mcp", json_post(b""), content_length=False)
    writer.write(head.replace(b"\r\n\r\n", b"\r\nContent-Length: 1000\r\n\r\n") + b'{"jsonrpc": "2.0", ')
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and gw.stderr().count("http.client_disconnected") == before:
        await asyncio.sleep(0.05)
    err = gw.stderr()
    assert err.count("http.client_disconnected") == before + 1
    line = next(x for x in err.splitlines() if "http.client_disconnected" in x)
    assert json.loads(line)["level"] == "debug"
    assert "Traceback" not in err and "Exception in ASGI application" not in err
    assert httpx.get(gw.base + "/readyz", timeout=5).status_code == 200


@pytest.mark.parametrize("accept", ["application/json", "application/json, text/event-stream"])
async def test_a_client_that_leaves_during_a_call_still_gets_its_audit_record(gw: GatewayProcess,
                                                                            accept: str) -> None:
    client = session(gw)
    sid = client.session_id
    assert sid is not None
    marker = f"leave-{accept.count(',')}-{time.monotonic_ns()}"
    payload = body("tools/call", {"name": "basic__slow", "arguments": {"seconds": 0.6, "steps": 2, "m": marker}},
                   rid=11)
    headers = [("Host", "127.0.0.1"), ("Content-Type", "application/json"), ("Accept", accept),
               ("Mcp-Session-Id", sid), ("MCP-Protocol-Version", "2025-11-25")]
    before = len(gw.records("tool.call"))
    _reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(build("POST", "/mcp", headers, payload))
    await writer.drain()
    await asyncio.sleep(0.2)  # the call is running upstream
    writer.close()
    records = gw.wait_records("tool.call", before + 1, timeout=10)
    time.sleep(0.5)
    records = gw.records("tool.call")
    assert len(records) == before + 1
    assert records[-1]["tool"]["name"] == "basic__slow"
    assert "Traceback" not in gw.stderr()
    client.close()


async def test_dns_rebinding_protection_covers_every_path_and_the_absolute_form_target(gw: GatewayProcess) -> None:
    """Over a real socket, through bastion's own HTTP protocol: a foreign Host is 421 on every path (not only the
    MCP one), and an absolute-form target's authority is what is judged, whatever Host says (RFC 9112 3.2.2)."""
    ping = body("ping")
    loopback = f"127.0.0.1:{gw.port}"
    foreign = "rebind.attacker.example"
    before = refusals(gw).get("host", 0)
    refused = [
        build("GET", "/readyz", [("Host", foreign), ("Connection", "close")]),
        build("GET", "/metrics", [("Host", foreign), ("Connection", "close")]),
        build("GET", "/healthz", [("Host", f"{foreign}:{gw.port}"), ("Connection", "close")]),
        build("POST", "/mcp/", [("Host", foreign), ("Content-Type", "application/json"), ("Connection", "close")],
              ping),
        build("POST", f"http://{foreign}/mcp", json_post(ping), ping),  # Host: 127.0.0.1
        build("GET", f"http://{foreign}:{gw.port}/readyz", [("Host", loopback), ("Connection", "close")]),
    ]
    for raw in refused:
        response = await exchange(gw.port, raw)
        assert response.status == 421, (raw[:60], response)
        assert response.header("location") is None
        assert response.json()["error"]["message"] == "Misdirected Request: Host not allowed"
    # A target split across packets is judged whole.
    split = build("POST", f"http://{foreign}/mcp", json_post(ping), ping)
    response = await exchange(gw.port, split[:20], split[20:], pause=0.1)
    assert response.status == 421
    assert refusals(gw).get("host", 0) - before == len(refused) + 1

    params = {"_meta": {"io.modelcontextprotocol/protocolVersion": V,
                        "io.modelcontextprotocol/clientCapabilities": {}}}
    modern = body("tools/list", params)
    routing = list(request_headers("tools/list", params, V, None).items())
    served = await exchange(gw.port, build("POST", f"http://{loopback}/mcp",
                                           [("Host", foreign), *json_post(modern)[1:], *routing], modern))
    assert served.status == 200, served
    assert "basic__echo" in {tool["name"] for tool in served.json()["result"]["tools"]}
    ready = await exchange(gw.port, build("GET", f"http://{loopback}/readyz", [("Host", foreign),
                                                                             ("Connection", "close")]))
    assert ready.status == 200
    assert ready.json()["status"] == "ready"
    for path in ("/readyz", "/healthz"):
        response = await exchange(gw.port, build("GET", path, [("Host", loopback), ("Connection", "close")]))
        assert response.status == 200, path
    assert "Traceback" not in gw.stderr()
