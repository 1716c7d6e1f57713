"""A secret a caller types never reaches the audit log as typed: it passes the sanitizer's secret rules first.

A tool call's arguments are logged only with ``audit.log_arguments`` (and then redacted); a resource URI is
recorded in every ``request`` record, and a template makes it as free as an argument (``memo://notes/{name}``),
quoted again in the error message of one that is unknown or refused. Real ``bastion serve``, real stdio upstream.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT, RpcClient, parse_body

# A GitHub token's shape (one of the sanitizer's default secret rules); random, never a real one.
TOKEN = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
MASK = "[REDACTED:github-token]"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess({"auth": "none", "upstreams": {"basic": stdio_upstream()},
                              "audit": {"sinks": ["stdout"], "log_arguments": True}},
                             tmp_path_factory.mktemp("audit-secrets")).start()
    yield gateway
    gateway.stop()


def test_logged_arguments_pass_the_secret_rules(gw: GatewayProcess) -> None:
    client = RpcClient(gw.url)
    client.initialize()
    try:
        assert "result" in client.call("basic__echo", {"message": f"my token {TOKEN}"})
    finally:
        client.close()
    (record,) = [r for r in gw.records("tool.call") if r["tool"]["name"] == "basic__echo"]
    assert record["arguments"] == {"message": f"my token {MASK}"}
    assert TOKEN not in orjson.dumps(record).decode()


def test_a_secret_in_a_resource_uri_is_redacted_in_its_request_records(gw: GatewayProcess) -> None:
    client = RpcClient(gw.url)
    client.initialize()
    try:
        assert "result" in client.request("resources/read", {"uri": f"basic+memo://notes/{TOKEN}"})
        assert "error" in client.request("resources/read", {"uri": f"nowhere+memo://notes/{TOKEN}"})
        assert "error" in client.request("prompts/get", {"name": TOKEN})
    finally:
        client.close()
    # Refused at the front door (a 2026-07-28 envelope without its client capabilities), before any dispatch.
    body = {"jsonrpc": "2.0", "id": "front", "method": "resources/read",
            "params": {"uri": f"basic+memo://notes/{TOKEN}",
                       "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}
    answer = parse_body(httpx.post(gw.url, content=orjson.dumps(body), headers={
        "Accept": ACCEPT, "Content-Type": "application/json", "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "resources/read", "Mcp-Name": f"basic+memo://notes/{TOKEN}"}, timeout=30))[-1]
    assert "error" in answer
    records = gw.records("request")
    assert len(records) == 4, records
    assert all(TOKEN not in orjson.dumps(r).decode() for r in records), records
    read = next(r for r in records if r["outcome"] == "allowed")
    assert (read["target"]["uri"], read["target"]["original"]) == \
        (f"basic+memo://notes/{MASK}", f"memo://notes/{MASK}")
    assert any(r["error"] and MASK in r["error"]["message"] for r in records)


def test_a_secret_in_an_unknown_tool_name_is_redacted_in_its_record_and_metrics(gw: GatewayProcess) -> None:
    client = RpcClient(gw.url)
    client.initialize()
    try:
        answer = client.call(f"x {TOKEN}", {"message": "m"})
        assert "error" in answer or answer["result"].get("isError"), answer
    finally:
        client.close()
    (record,) = [r for r in gw.records("tool.call") if MASK in r["tool"]["name"] or TOKEN in r["tool"]["name"]]
    assert TOKEN not in orjson.dumps(record).decode(), record
    assert record["tool"]["name"] == f"x {MASK}"
    assert TOKEN not in httpx.get(gw.base + "/metrics", timeout=10).text
