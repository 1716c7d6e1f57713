"""One exception root, three error planes.

Every error bastion raises while serving a request belongs to exactly one plane, and the plane fixes what the
client sees:

- ``http``: the request is refused before it is understood (credentials, Origin, session, version). The client
  gets an HTTP status, optionally with a JSON-RPC error body without an id.
- ``protocol``: a JSON-RPC error response (``error{code, message, data}``) to one request.
- ``tool``: a ``tools/call`` result with ``isError: true`` whose text a model can read and act on.

Foreign exceptions (httpx, redis, jsonschema, OSError) are translated at the module boundary that meets them, so
nothing outside this hierarchy reaches the request handlers. Messages are written for the client: they never carry
tracebacks, upstream URLs or secrets; details meant for operators go in ``log_detail``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from bastion.outcome import Outcome

Plane = Literal["http", "protocol", "tool"]

# JSON-RPC 2.0 and MCP codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
MISSING_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022

# bastion's own codes. The 2026-07-28 revision asks that application codes live outside -32768..-32000, so
# they can never be mistaken for a spec-defined code.
RATE_LIMITED = -31001
UPSTREAM_UNAVAILABLE = -31002
UPSTREAM_TIMEOUT = -31003
LIMITER_UNAVAILABLE = -31004
AUDIT_UNAVAILABLE = -31005
REQUEST_TOO_LARGE = -31006
POLICY_DENIED = -31007
# A tool whose upstream's definitions are being re-checked after a change (refresh gate): retry shortly.
CATALOGUE_CHANGING = -31010


class BastionError(Exception):
    """Root of every exception bastion raises on purpose."""


class ConfigError(BastionError):
    """A configuration or policy file is wrong. Raised at load time, never while serving a request.

    ``source`` names the file, ``path`` the key path inside it (``upstreams.files.command``), ``line`` the
    1-based line when known.
    """

    def __init__(self, message: str, *, source: str | None = None, path: str | None = None,
                 line: int | None = None) -> None:
        self.message = message
        self.source = source
        self.path = path
        self.line = line
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ""
        if self.source:
            where = self.source + (f":{self.line}" if self.line else "")
        if self.path:
            where = f"{where} [{self.path}]" if where else f"[{self.path}]"
        return f"{where}: {self.message}" if where else self.message


class RequestError(BastionError):
    """An error answering one client request. Subclasses fix the plane."""

    plane: ClassVar[Plane]
    # What a tools/call this error stops counts as (its span's and, for tool errors, its audit record's outcome).
    # ``None``: the error does not say, and the pipeline counts it by where it stopped the call (see ``Pipeline``).
    outcome: ClassVar[Outcome | None] = None

    def __init__(self, message: str, *, log_detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.log_detail = log_detail


class HttpError(RequestError):
    """Refuse the HTTP request itself. ``code`` adds a JSON-RPC error body (without id) when set."""

    plane: ClassVar[Plane] = "http"

    def __init__(self, status: int, message: str, *, code: int | None = None,
                 data: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None,
                 log_detail: str | None = None) -> None:
        super().__init__(message, log_detail=log_detail)
        self.status = status
        self.code = code
        self.data = dict(data) if data is not None else None
        self.headers = dict(headers or {})


class ProtocolError(RequestError):
    """A JSON-RPC error response to one request."""

    plane: ClassVar[Plane] = "protocol"

    def __init__(self, code: int, message: str, *, data: Mapping[str, Any] | None = None,
                 http_status: int = 200, log_detail: str | None = None) -> None:
        super().__init__(message, log_detail=log_detail)
        self.code = code
        self.data = dict(data) if data is not None else None
        # The modern revision pins HTTP statuses to some JSON-RPC errors (404 for -32601, 400 for -32602 on
        # missing _meta); everything else travels with 200.
        self.http_status = http_status

    def to_error(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


class ToolError(RequestError):
    """A ``tools/call`` that ends as an ``isError: true`` result the model can read."""

    plane: ClassVar[Plane] = "tool"

    def __init__(self, message: str, *, structured: Mapping[str, Any] | None = None,
                 log_detail: str | None = None) -> None:
        super().__init__(message, log_detail=log_detail)
        self.structured = dict(structured) if structured is not None else None

    def to_result(self) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": self.message}], "isError": True}


# Specific errors. Each is a plane plus a fixed code, so call sites say what happened, not how to render it.


class AuthenticationError(HttpError):
    """Missing, malformed or invalid credentials: 401 with a ``WWW-Authenticate`` challenge."""

    def __init__(self, message: str, *, challenge: str, log_detail: str | None = None) -> None:
        super().__init__(401, message, headers={"WWW-Authenticate": challenge}, log_detail=log_detail)


class InvalidParams(ProtocolError):
    def __init__(self, message: str, *, data: Mapping[str, Any] | None = None, http_status: int = 200,
                 log_detail: str | None = None) -> None:
        super().__init__(INVALID_PARAMS, message, data=data, http_status=http_status, log_detail=log_detail)


class MessageRejected(ProtocolError):
    """A JSON-RPC message refused before dispatch (malformed envelope, unrepresentable or too deeply nested
    values). ``request_id`` is the message's id when it could be read, so the error response carries it."""

    def __init__(self, code: int, message: str, *, request_id: str | int | None = None,
                 log_detail: str | None = None) -> None:
        super().__init__(code, message, http_status=400, log_detail=log_detail)
        self.request_id = request_id


class UnknownTool(InvalidParams):
    """Unknown tool, or (by default) a tool the policy hides: the two must look the same to the caller."""

    outcome: ClassVar[Outcome | None] = "denied"

    def __init__(self, name: str, *, log_detail: str | None = None) -> None:
        super().__init__(f"Unknown tool: {name}", log_detail=log_detail)
        self.name = name


class PolicyDenied(ProtocolError):
    """A call the policy denied, explained because the admin opted in (``reveal: true``). Distinct from
    ``UnknownTool`` on purpose: the caller learns the tool exists and which rule stands in its way."""

    outcome: ClassVar[Outcome | None] = "denied"

    def __init__(self, tool: str, rule_id: str | None, description: str | None, *,
                 log_detail: str | None = None, touched: tuple[str, ...] = ()) -> None:
        why = f"rule '{rule_id}'" if rule_id is not None else "default deny (no rule allows it)"
        text = f"Call to {tool} denied by policy: {why}"
        if description:
            text += f": {description}"
        data: dict[str, Any] = {"tool": tool, "rule": rule_id, "description": description}
        if touched:
            # A flow denial: which labels earlier calls of this context touched (the calls themselves are audited).
            text += f" (this context already touched: {', '.join(touched)})"
            data["touched"] = list(touched)
        super().__init__(POLICY_DENIED, text, data=data, log_detail=log_detail)
        self.rule_id = rule_id


class MethodNotFound(ProtocolError):
    def __init__(self, method: str, *, http_status: int = 200) -> None:
        super().__init__(METHOD_NOT_FOUND, f"Method not found: {method}", http_status=http_status)


class RateLimited(ProtocolError):
    """A limit tripped. ``data`` carries the limit's name and ``retryAfter`` in milliseconds."""

    outcome: ClassVar[Outcome | None] = "rate_limited"

    def __init__(self, limit: str, retry_after_ms: int, *, detail: Mapping[str, Any] | None = None) -> None:
        data: dict[str, Any] = {"limit": limit, "retryAfter": max(0, int(retry_after_ms))}
        if detail:
            data.update(detail)
        super().__init__(RATE_LIMITED, f"Rate limit exceeded ({limit}); retry after {data['retryAfter']} ms",
                         data=data)
        self.limit = limit
        self.retry_after_ms = data["retryAfter"]


class LimiterUnavailable(ProtocolError):
    """The shared limiter cannot be consulted and the failure mode is ``closed``."""

    outcome: ClassVar[Outcome | None] = "rate_limited"

    def __init__(self, *, log_detail: str | None = None) -> None:
        super().__init__(LIMITER_UNAVAILABLE, "Rate limiter unavailable; call refused (fail-closed)",
                         log_detail=log_detail)


class UpstreamUnavailable(ProtocolError):
    outcome: ClassVar[Outcome | None] = "upstream_error"

    def __init__(self, upstream: str, *, log_detail: str | None = None) -> None:
        super().__init__(UPSTREAM_UNAVAILABLE, f"Upstream '{upstream}' is unavailable",
                         data={"upstream": upstream}, log_detail=log_detail)
        self.upstream = upstream


class UpstreamTimeout(ProtocolError):
    outcome: ClassVar[Outcome | None] = "timeout"

    def __init__(self, upstream: str, timeout_s: float) -> None:
        super().__init__(UPSTREAM_TIMEOUT, f"Upstream '{upstream}' did not answer within {timeout_s:g} s",
                         data={"upstream": upstream, "timeoutMs": int(timeout_s * 1000)})
        self.upstream = upstream


class CatalogueChanging(ProtocolError):
    """A tool call met a definition change: its upstream's definitions are still being re-checked (after
    ``timeout_s``), or the definition the call was checked against is no longer the one in force."""

    def __init__(self, upstream: str, tool: str, *, timeout_s: float | None = None) -> None:
        if timeout_s is not None:
            message = (f"Tool definitions of upstream '{upstream}' changed and are still being checked after "
                       f"{timeout_s:g} s; retry shortly")
        else:
            message = f"The definition of tool '{tool}' changed while the call was checked; list tools and retry"
        data: dict[str, Any] = {"upstream": upstream, "tool": tool}
        if timeout_s is not None:
            data["timeoutMs"] = int(timeout_s * 1000)
        super().__init__(CATALOGUE_CHANGING, message, data=data)
        self.upstream = upstream


class UpstreamRpcError(ProtocolError):
    """A JSON-RPC error returned by an upstream, relayed to the caller (message sanitized by the caller)."""

    outcome: ClassVar[Outcome | None] = "upstream_error"


class AuditUnavailable(ProtocolError):
    def __init__(self, *, log_detail: str | None = None) -> None:
        super().__init__(AUDIT_UNAVAILABLE, "Audit sink unavailable; call refused (audit.required)",
                         log_detail=log_detail)


class Refused(HttpError):
    """An HTTP-level refusal of the front door (Host, Origin, headers, media type, size, framing, timeouts).

    ``reason`` is one of a closed set (``bastion.server.refusals.RefusalReason``): it labels the
    ``bastion_http_refusals_total`` metric and the ``http.refused`` audit record, so operators see the refusals
    that happen before (or without) authentication.
    """

    def __init__(self, status: int, message: str, *, reason: str, code: int | None = None,
                 headers: Mapping[str, str] | None = None, log_detail: str | None = None) -> None:
        super().__init__(status, message, code=code, headers=headers, log_detail=log_detail)
        self.reason = reason
