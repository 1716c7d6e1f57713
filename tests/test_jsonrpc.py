from __future__ import annotations

from typing import Any

import pytest

from bastion import jsonrpc
from bastion.errors import INVALID_REQUEST, PARSE_ERROR, ProtocolError


def test_classifies_requests_notifications_and_responses() -> None:
    assert jsonrpc.classify({"jsonrpc": "2.0", "id": 1, "method": "ping"}).kind == "request"
    assert jsonrpc.classify({"jsonrpc": "2.0", "method": "notifications/initialized"}).kind == "notification"
    assert jsonrpc.classify({"jsonrpc": "2.0", "id": "a", "result": {}}).kind == "response"
    assert jsonrpc.classify({"jsonrpc": "2.0", "id": "a", "error": {"code": 1, "message": "x"}}).kind == "response"


@pytest.mark.parametrize("bad", [
    [], "x", {"id": 1, "method": "ping"}, {"jsonrpc": "1.0", "id": 1, "method": "ping"},
    {"jsonrpc": "2.0", "id": None, "method": "ping"}, {"jsonrpc": "2.0", "id": True, "method": "ping"},
    {"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, {"jsonrpc": "2.0", "id": 1, "method": ""},
    {"jsonrpc": "2.0", "id": 1, "method": 7},
    {"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}, {"jsonrpc": "2.0", "id": 1},
])
def test_malformed_envelopes_are_invalid_requests(bad: Any) -> None:
    with pytest.raises(ProtocolError) as info:
        jsonrpc.classify(bad)
    assert info.value.code == INVALID_REQUEST
    assert info.value.http_status == 400


def test_parse_errors_are_400_parse_error() -> None:
    with pytest.raises(ProtocolError) as info:
        jsonrpc.loads(b"{not json")
    assert info.value.code == PARSE_ERROR
    assert info.value.http_status == 400


def test_builders() -> None:
    assert jsonrpc.result(3, {"a": 1}) == {"jsonrpc": "2.0", "id": 3, "result": {"a": 1}}
    err = jsonrpc.error(3, ProtocolError(-32602, "bad", data={"x": 1}))
    assert err == {"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "bad", "data": {"x": 1}}}
    assert jsonrpc.error_body(-32600, "no")["id"] is None
    assert jsonrpc.obj([1]) == {}
    assert jsonrpc.obj({"a": 1}) == {"a": 1}
