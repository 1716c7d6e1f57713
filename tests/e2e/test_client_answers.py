"""A client's answers to what bastion relays to it (a session's sampling and elicitation requests), however careless,
reach the upstream as JSON-RPC answers: never a crash in the gateway."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT, RpcClient


@pytest.mark.parametrize("code", ["abc", None, [1], {"n": 1}, True, 1.5])
def test_a_clients_error_answer_with_a_malformed_code_is_relayed_as_an_error(gateway: GatewayProcess,
                                                                             code: Any) -> None:
    """The client declines the upstream's sampling request with an error whose ``code`` is not an integer. It
    crashed the relay (``upstream.server_request_failed`` with a traceback, and the upstream heard only
    ``Internal error``); now the upstream hears the client's own message, under ``-32603``."""
    client = RpcClient(gateway.url)
    client.initialize(capabilities={"sampling": {}})
    headers = {"Accept": ACCEPT, "Content-Type": "application/json", "Mcp-Session-Id": client.session_id or "",
               "MCP-Protocol-Version": client.version}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "basic__ask_llm", "arguments": {"prompt": "meaning of life?"}}}
    messages: list[dict[str, Any]] = []
    with httpx.Client(timeout=30) as http, \
            http.stream("POST", gateway.url, content=json.dumps(body), headers=headers) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            messages.append(message)
            if message.get("method") == "sampling/createMessage":
                declined = {"jsonrpc": "2.0", "id": message["id"],
                            "error": {"code": code, "message": "the user declined"}}
                assert client.post(declined).status_code == 202
    assert messages[0]["method"] == "sampling/createMessage"
    final = messages[-1]
    assert final["id"] == 1
    # The basic fixture's SDK server turns the failed sampling into an error of its own, carrying the message.
    assert "the user declined" in json.dumps(final), final
    assert "upstream.server_request_failed" not in gateway.stderr()
    assert "Traceback" not in gateway.stderr()
