"""``Answer``: the HTTP status and headers travel beside the JSON-RPC message, never inside it."""

from __future__ import annotations

import orjson

from bastion.errors import INVALID_PARAMS, ProtocolError
from bastion.server.answer import Answer


def test_an_error_travels_with_its_own_status_and_the_message_stays_pure_json_rpc() -> None:
    answer = Answer.error(7, ProtocolError(INVALID_PARAMS, "bad", http_status=400))
    response = answer.response()
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    body = orjson.loads(response.body)
    assert body == {"jsonrpc": "2.0", "id": 7, "error": {"code": INVALID_PARAMS, "message": "bad"}}


def test_a_status_given_explicitly_wins_over_the_errors_own() -> None:
    # The session-based revisions carry every JSON-RPC error in a 200, whatever the error says.
    answer = Answer.error(1, ProtocolError(INVALID_PARAMS, "bad", http_status=400), 200)
    assert answer.response().status_code == 200


def test_an_empty_answer_has_no_body_and_no_media_type() -> None:
    response = Answer.empty(202).response()
    assert response.status_code == 202
    assert response.body == b""
    assert "content-type" not in response.headers
    assert response.headers["content-length"] == "0"


def test_headers_reach_the_response() -> None:
    response = Answer({"jsonrpc": "2.0", "id": 1, "result": {}}, headers={"Mcp-Session-Id": "abc"}).response()
    assert response.status_code == 200
    assert response.headers["mcp-session-id"] == "abc"
    assert orjson.loads(response.body)["result"] == {}


def test_a_batch_is_a_list_body() -> None:
    items = [{"jsonrpc": "2.0", "id": 1, "result": {}}, {"jsonrpc": "2.0", "id": 2, "result": {}}]
    assert orjson.loads(Answer(items).response().body) == items
