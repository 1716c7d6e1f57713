"""``message_event`` is ``encode_event(data, event="message")``, byte for byte, whatever the data holds."""

from __future__ import annotations

import orjson
import pytest

from bastion.server.responder import message_event
from bastion.sse import encode_event


@pytest.mark.parametrize("data", [
    b"",
    b'{"jsonrpc":"2.0","id":1,"result":{}}',
    orjson.dumps({"jsonrpc": "2.0", "id": 2, "result": {"text": "line one\nline two\r\nthree\r"}}),
    b'{"a":\n1}',  # a fragment embedded raw may carry line breaks orjson itself never writes
    b'{"a":\r\n1}\r',
    b"\n\n",
])
def test_the_same_bytes_as_the_general_encoder(data: bytes) -> None:
    assert message_event(data) == encode_event(data, event="message")


def test_a_big_single_line_body_is_framed_as_one_data_line() -> None:
    body = orjson.dumps({"tools": [{"name": f"t{i}", "description": "x" * 1000} for i in range(500)]})
    assert message_event(body) == b"event: message\ndata: " + body + b"\n\n"
