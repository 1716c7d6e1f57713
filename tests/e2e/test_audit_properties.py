"""A bounded property run through a real gateway process: arbitrary JSON arguments over a real socket, exactly
one audit record per tools/call, no 5xx, no traceback in the gateway's log, and the gateway still serves.

The in-process runs (tests/server/test_one_record_per_call.py) explore far more inputs; this one proves the same
holds with uvicorn, the real audit stdout sink and the stdio upstream in the loop.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT, RpcClient, parse_body

TEXT = st.text(st.characters(codec=None), max_size=8)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**53 - 2, max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4)
    | st.builds(lambda depth, leaf: json.loads("[" * depth + json.dumps(leaf) + "]" * depth),
                st.integers(1, 300), st.integers()),
    max_leaves=15)
IDS = itertools.count(1)


def test_one_record_per_call_through_a_real_gateway(gateway: GatewayProcess) -> None:
    client = RpcClient(gateway.url)
    client.initialize()
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, "Mcp-Session-Id": client.session_id or "",
               "MCP-Protocol-Version": client.version}
    sent: list[int] = []
    before = len(gateway.records("tool.call"))

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(arguments=st.dictionaries(TEXT, VALUES, max_size=4), tool=st.sampled_from(["basic__echo", "nope__x"]))
    def one_call(arguments: dict[str, Any], tool: str) -> None:
        rid = next(IDS)
        body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                           "params": {"name": tool, "arguments": arguments}}, ensure_ascii=True)
        r = httpx.post(gateway.url, content=body.encode(), headers=headers, timeout=30)
        assert r.status_code < 500, r.text
        assert parse_body(r)[0]["id"] == rid
        sent.append(rid)

    try:
        one_call()
        records = gateway.wait_records("tool.call", before + len(sent))[before:]
        assert sorted(d["request_id"] for d in records) == sorted(sent)
        assert "Traceback" not in gateway.stderr()
        assert client.call("basic__echo", {"message": "still serving"})["result"]["content"][0]["text"] == \
            "still serving"
    finally:
        client.close()
