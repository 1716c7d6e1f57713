"""``Answer``: what the front door sends back for one POST, as data: a JSON body, an HTTP status, headers.

The HTTP status of a JSON-RPC answer is not part of the JSON-RPC message. The session-based revisions answer
every JSON-RPC error with 200; the 2026-07-28 revision pins some codes to 400 or 404 (``MODERN_ERROR_STATUS``).
Whoever turns a request into a JSON-RPC message therefore also says which status it travels with, in an
``Answer``, and the transport writes it as JSON, as one SSE event, or as one item of a batch (where only the
message counts). A streamed answer (SSE with messages before the result, a GET or listen stream) is a starlette
``StreamingResponse`` instead: its status is always 200 and its body is produced while the request runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response

from bastion import jsonrpc
from bastion.errors import (
    HEADER_MISMATCH,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MISSING_CLIENT_CAPABILITY,
    UNSUPPORTED_PROTOCOL_VERSION,
    HttpError,
    ProtocolError,
)
from bastion.jsonrpc import RequestId

__all__ = ["KEEPALIVE_S", "MODERN_ERROR_STATUS", "SSE_HEADERS", "Answer", "JsonResponse", "http_error_response",
           "json_response"]

# The 2026-07-28 revision gives these JSON-RPC errors an HTTP status of their own, whoever raised them (an
# upstream's relayed -32021 included); every other error travels with 200.
MODERN_ERROR_STATUS = {HEADER_MISMATCH: 400, MISSING_CLIENT_CAPABILITY: 400, UNSUPPORTED_PROTOCOL_VERSION: 400,
                       METHOD_NOT_FOUND: 404}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# A comment line on idle streams, so proxies and clients do not time them out.
KEEPALIVE_S = 15.0


@dataclass(frozen=True, slots=True)
class Answer:
    """One POST's answer. ``body`` is a JSON-RPC message (or a batch of them), or ``None`` for an empty body
    (202 for notifications and responses)."""

    body: dict[str, Any] | list[Any] | None
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def error(cls, rid: RequestId | None, err: ProtocolError, status: int | None = None) -> Answer:
        """A JSON-RPC error, with the error's own HTTP status unless told otherwise."""
        return cls(jsonrpc.error(rid, err), err.http_status if status is None else status)

    @classmethod
    def empty(cls, status: int = 202) -> Answer:
        return cls(None, status)

    def response(self) -> Response:
        if self.body is None:
            return Response(status_code=self.status, headers=dict(self.headers))
        return json_response(self.body, self.status, self.headers)


class JsonResponse(Response):
    """``Response(content, status_code, headers, media_type="application/json")`` with ``content`` already encoded:
    the same status, body and header list, built without starlette's generic rendering and header logic (a few
    percent of a forwarded call's CPU). The front door writes it in one call (``server/protocol.deliver``)."""

    media_type = "application/json"

    def __init__(self, content: bytes, status_code: int = 200, headers: Mapping[str, str] | None = None) -> None:
        self.status_code = status_code
        self.body = content
        self.background = None
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()] if headers else []
        names = {name for name, _ in raw}
        if b"content-length" not in names and not (status_code < 200 or status_code in (204, 304)):
            raw.append((b"content-length", str(len(content)).encode("latin-1")))
        if b"content-type" not in names:
            raw.append((b"content-type", b"application/json"))
        self.raw_headers = raw


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return JsonResponse(jsonrpc.dumps(body), status, headers)


def http_error_response(exc: HttpError) -> Response:
    body = jsonrpc.error_body(exc.code if exc.code is not None else INVALID_REQUEST, exc.message, exc.data)
    return json_response(body, exc.status, exc.headers)
