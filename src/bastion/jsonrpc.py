"""JSON-RPC 2.0 envelopes: parse what clients send, build what bastion answers. Pure; no I/O.

bastion parses each body once with orjson and classifies it; handlers receive plain dicts. Validation is as
strict as the spec (``jsonrpc: "2.0"``, id a string or integer, never null) because an ambiguous envelope is how
smuggling between a gateway and its upstreams starts.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import orjson

from bastion import strictjson
from bastion.errors import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, MessageRejected, ProtocolError

RequestId = str | int
Kind = Literal["request", "notification", "response"]


class Message:
    """One classified message. ``id``, ``method`` and ``params`` are read from ``raw`` once, here: the front door
    and the dispatcher consult them a dozen times per request, and ``raw`` is never changed after classification.
    """

    __slots__ = ("id", "kind", "method", "params", "raw")

    def __init__(self, kind: Kind, raw: dict[str, Any]) -> None:
        self.kind = kind
        self.raw = raw
        self.id: RequestId | None = as_request_id(raw.get("id"))
        method = raw.get("method", "")
        self.method: str = method if type(method) is str else str(method)
        params = raw.get("params")
        self.params: dict[str, Any] = params if isinstance(params, dict) else {}

    def __repr__(self) -> str:
        return f"Message(kind={self.kind!r}, raw={self.raw!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and (self.kind, self.raw) == (other.kind, other.raw)

    __hash__ = None  # type: ignore[assignment]  # equal by value, and ``raw`` is a dict


def as_request_id(value: object) -> RequestId | None:
    """``value`` if it can be a request id (a string or an integer, never a boolean), else None.

    Every id a client names goes through here before it is looked up in bastion's own tables (a request to
    cancel, an answer to one of bastion's requests): a JSON array or object is not hashable and would crash the
    lookup, and ``true`` or ``1.0`` would find the request whose id is ``1``."""
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


class ErrorObject(NamedTuple):
    code: int
    message: str
    data: dict[str, Any] | None


def read_error(error: object, default_message: str) -> ErrorObject:
    """A peer's JSON-RPC ``error`` member as bastion passes it on: whatever a careless or hostile peer (a client
    answering one of bastion's requests, an upstream answering a call) put in it, a code that is an integer
    (``-32603`` otherwise, and never a boolean), a string message and an object or no ``data``."""
    err = error if isinstance(error, dict) else {}
    code, message, data = err.get("code"), err.get("message"), err.get("data")
    return ErrorObject(code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR,
                       message if isinstance(message, str) else default_message,
                       data if isinstance(data, dict) else None)


def loads(body: bytes) -> Any:
    """Parse without the front door's checks (for trusted peers and tests); ``parse`` is the front door's."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(PARSE_ERROR, "Parse error: body is not valid JSON", http_status=400,
                            log_detail=str(exc)) from None


def parse(body: bytes, max_depth: int = strictjson.DEFAULT_MAX_DEPTH) -> strictjson.Document:
    """Parse a client's body; ``Document.flaw`` then locates what ``classify`` must refuse.

    Raises ``-32700`` for bytes that are not JSON, and ``-32600`` (no id: it cannot be read) for a body nested
    deeper than any parser here reads.
    """
    try:
        return strictjson.decode(body, max_depth)
    except strictjson.NotJson as exc:
        raise MessageRejected(PARSE_ERROR, "Parse error: body is not valid JSON", log_detail=exc.detail) from None
    except strictjson.TooDeepToRead as exc:
        raise MessageRejected(INVALID_REQUEST, f"Invalid Request: JSON nested deeper than {max_depth} levels",
                              log_detail=str(exc)) from None


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def readable_id(obj: Any, flaw: strictjson.Flaw | None = None) -> RequestId | None:
    """The message's id if it is one a response may echo (a string or a safe integer), else None."""
    if not isinstance(obj, dict) or (flaw is not None and flaw.path[:1] == ("id",)):
        return None
    rid = obj.get("id")
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        return None
    if isinstance(rid, int) and not -strictjson.MAX_SAFE_INTEGER <= rid <= strictjson.MAX_SAFE_INTEGER:
        return None
    if isinstance(rid, str) and strictjson.printable(rid) != rid:
        return None
    return rid


def classify(obj: Any, flaw: strictjson.Flaw | None = None) -> Message:
    """Validate one JSON-RPC message and say what it is.

    Raises ``MessageRejected``: ``-32600`` for a malformed envelope, ``-32602`` for params that cannot be
    accepted (``flaw`` inside them), each carrying the message's id whenever it could be read.
    """
    if not isinstance(obj, dict):
        raise MessageRejected(INVALID_REQUEST, "Invalid Request: a JSON-RPC message must be an object")
    rid = readable_id(obj, flaw)
    if obj.get("jsonrpc") != "2.0":
        raise MessageRejected(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', request_id=rid)
    has_id = "id" in obj
    if has_id and rid is None:
        raise MessageRejected(INVALID_REQUEST, "Invalid Request: id must be a string or an integer within "
                              "±(2^53-1), without lone surrogates")
    if flaw is not None:
        where = flaw.where()
        if flaw.path[:1] == ("params",):
            raise MessageRejected(INVALID_PARAMS, f"Invalid params: {flaw.problem} at {where}", request_id=rid)
        raise MessageRejected(INVALID_REQUEST, f"Invalid Request: {flaw.problem} at {where}", request_id=rid)
    if "method" in obj:
        if not isinstance(obj["method"], str) or not obj["method"]:
            raise MessageRejected(INVALID_REQUEST, "Invalid Request: method must be a non-empty string",
                                  request_id=rid)
        if "params" in obj and not isinstance(obj["params"], dict):
            # JSON-RPC allows positional (array) params; MCP methods take an object.
            raise MessageRejected(INVALID_PARAMS, "Invalid params: params must be an object", request_id=rid)
        return Message("request" if has_id else "notification", obj)
    if has_id and (("result" in obj) != ("error" in obj)):
        return Message("response", obj)
    raise MessageRejected(INVALID_REQUEST, "Invalid Request: neither a request, a notification nor a response",
                          request_id=rid)


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
