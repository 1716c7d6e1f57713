"""JSON-RPC 2.0 envelopes: parse what clients send, build what bastion answers. Pure; no I/O.

bastion parses each body once with orjson and classifies it; handlers receive plain dicts. Validation is as
strict as the spec (``jsonrpc: "2.0"``, id a string or integer, never null) because an ambiguous envelope is how
smuggling between a gateway and its upstreams starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from bastion.errors import INVALID_REQUEST, PARSE_ERROR, ProtocolError

RequestId = str | int
Kind = Literal["request", "notification", "response"]


@dataclass(frozen=True, slots=True)
class Message:
    kind: Kind
    raw: dict[str, Any]

    @property
    def id(self) -> RequestId | None:
        value = self.raw.get("id")
        return value if isinstance(value, str | int) and not isinstance(value, bool) else None

    @property
    def method(self) -> str:
        return str(self.raw.get("method", ""))

    @property
    def params(self) -> dict[str, Any]:
        params = self.raw.get("params")
        return params if isinstance(params, dict) else {}


def loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(PARSE_ERROR, "Parse error: body is not valid JSON", http_status=400,
                            log_detail=str(exc)) from None


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def classify(obj: Any) -> Message:
    """Validate one JSON-RPC message and say what it is. Raises -32600 for anything malformed."""
    if not isinstance(obj, dict):
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: a JSON-RPC message must be an object",
                            http_status=400)
    if obj.get("jsonrpc") != "2.0":
        raise ProtocolError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', http_status=400)
    has_id = "id" in obj
    rid = obj.get("id")
    if has_id and (isinstance(rid, bool) or not isinstance(rid, str | int)):
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer",
                            http_status=400)
    if "method" in obj:
        if not isinstance(obj["method"], str) or not obj["method"]:
            raise ProtocolError(INVALID_REQUEST, "Invalid Request: method must be a non-empty string",
                                http_status=400)
        if "params" in obj and not isinstance(obj["params"], dict):
            raise ProtocolError(INVALID_REQUEST, "Invalid Request: params must be an object", http_status=400)
        return Message("request" if has_id else "notification", obj)
    if has_id and (("result" in obj) != ("error" in obj)):
        return Message("response", obj)
    raise ProtocolError(INVALID_REQUEST, "Invalid Request: neither a request, a notification nor a response",
                        http_status=400)


def result(rid: RequestId | None, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": value}


def error(rid: RequestId | None, err: ProtocolError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": err.to_error()}


def error_body(code: int, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """An id-less JSON-RPC error, as the body of an HTTP-level refusal."""
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": None, "error": err}


def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def request(rid: RequestId, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one: for optional object fields of untrusted input."""
    return value if isinstance(value, dict) else {}
