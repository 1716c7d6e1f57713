"""The audit record: one versioned JSON object per event, built from what the gateway already knows.

Pure: builders take every input (including the clock reading) as arguments and return a plain ``dict`` ready
for ``orjson.dumps``. Nothing here does I/O, so the shape is tested exhaustively and the sinks stay dumb.

What a record never holds: credentials, tokens, the principal's claims, raw arguments unless the admin turned
``log_arguments`` on (and then only after redaction), or result content. Arguments are identified by a digest so
an incident responder can still match a call against a known payload.

``SCHEMA_VERSION`` changes only on a breaking change (a field removed, renamed or retyped); new optional fields
are added without a bump. ``audit/schema.json`` is the machine-readable contract and the tests hold the builders
to it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, cast

import orjson

from bastion.call import CallContext, CallRecord, Era
from bastion.catalogue_limits import LimitDrop
from bastion.errors import (
    AuditUnavailable,
    HttpError,
    LimiterUnavailable,
    RateLimited,
    RequestError,
    ToolError,
    UpstreamRpcError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.principal import Principal
from bastion.strictjson import MAX_SAFE_INTEGER, printable
from bastion.tracing.traceparent import parse_traceparent

__all__ = [
    "REQUEST_STAGES",
    "SCHEMA_VERSION",
    "AuthFailureReason",
    "Decision",
    "Outcome",
    "RequestTarget",
    "arguments_digest",
    "as_outcome",
    "auth_failure_record",
    "call_record",
    "call_verdict",
    "canonical_json",
    "catalogue_drop_record",
    "classify_outcome",
    "definition_finding_record",
    "fallback_call_record",
    "http_refused_record",
    "pin_approve_record",
    "pin_drift_record",
    "policy_reload_record",
    "record_stage",
    "request_outcome",
    "request_record",
    "rfc3339",
    "session_record",
    "tools_list_record",
]

SCHEMA_VERSION = 1

Decision = Literal["allow", "deny", "error"]
Outcome = Literal[
    "allowed",               # forwarded; the result went back unchanged
    "sanitized",             # forwarded; the sanitizer changed the result (see "sanitize")
    "denied",                # policy refused (or hid) the tool
    "rate_limited",          # a rate or concurrency limit tripped (see "limit")
    "limiter_unavailable",   # the shared limiter was down and the failure mode is closed
    "invalid_input",         # arguments failed the tool's inputSchema (see "violations")
    "invalid_output",        # the upstream's result failed the outputSchema; withheld
    "malformed_result",      # the upstream's result was not a well-formed CallToolResult; withheld
    "upstream_error",        # the upstream answered with a JSON-RPC error
    "timeout",               # the upstream did not answer in time
    "upstream_unavailable",  # the upstream could not be reached
    "client_disconnected",   # the client went away (or cancelled) before the answer
    "audit_unavailable",     # audit.required and a sink failed: the result was withheld
    "error",                 # anything else; details in the gateway log
]
AuthFailureReason = Literal[
    "missing_credentials", "malformed_credentials", "unknown_key", "invalid_signature", "expired",
    "not_yet_valid", "invalid_issuer", "invalid_audience", "missing_claim", "jwks_unavailable", "other",
]

_DECISIONS: Mapping[Outcome, Decision] = {
    "allowed": "allow", "sanitized": "allow",
    "denied": "deny", "rate_limited": "deny", "limiter_unavailable": "deny", "invalid_input": "deny",
    "invalid_output": "deny", "audit_unavailable": "deny",
    "upstream_error": "error", "malformed_result": "error", "timeout": "error", "upstream_unavailable": "error",
    "client_disconnected": "error", "error": "error",
}

# Keys whose values are masked in logged arguments even after the admin's redactor ran: an opted-in argument log
# must still not become a credential store.
_SECRET_KEY_HINTS = ("password", "passwd", "secret", "token", "apikey", "api_key", "authorization", "credential",
                     "private_key", "cookie")
_MASK = "[REDACTED]"
_MAX_STRING = 4096
_MAX_SHORT = 256
# Logged arguments are cut below this depth (and the rest replaced by a marker): a record is for reading.
_MAX_LOGGED_DEPTH = 32
_DEEPER = "[nested too deeply to log]"


def rfc3339(epoch_s: float) -> str:
    """``2026-03-01T12:00:00.123Z``: UTC, millisecond precision, sortable as text.

    The same text as ``datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds")`` with ``Z``
    (microseconds rounded half to even, then cut to milliseconds, as ``datetime`` does), with the date and time
    of day formatted once per second: every audited call stamps a record, most of them within the same second.
    """
    frac, whole = math.modf(epoch_s)
    micros = round(frac * 1e6)
    second = int(whole)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    elif micros < 0:
        second, micros = second - 1, micros + 1_000_000
    return f"{_second_text(second)}.{micros // 1000:03d}Z"


@functools.lru_cache(maxsize=4)
def _second_text(second: int) -> str:
    """``2026-03-01T12:00:00`` for an epoch second (a pure memo: the last few seconds stamped)."""
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def arguments_digest(arguments: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``arguments`` (keys sorted, no whitespace, UTF-8).

    Two calls with the same arguments get the same digest whatever the key order the client sent. Total: any
    value gets a digest (see ``canonical_json`` for the values orjson cannot encode).
    """
    return _digest(arguments)[0]


def canonical_json(value: Any) -> bytes:
    """Canonical JSON of any value, never raising: orjson's encoding (sorted keys, compact, UTF-8) when it
    can, else the same form written out iteratively, for what orjson refuses: nesting deeper than 254 levels,
    integers beyond 64 bits (written exactly), lone surrogates (written as their ``\\udXXX`` escape, as JSON
    text carries them), non-string keys (``str(key)``), other objects (their ``repr`` as a string)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=_unjsonable)
    except (TypeError, ValueError):
        return _canonical_fallback(value)


def _digest(arguments: Any) -> tuple[str, str | None]:
    """The digest, and a note for ``audit_error`` when it could not be the standard canonical encoding."""
    value = {} if arguments is None else arguments
    note = None
    try:
        canonical = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
                                 default=_unjsonable)
    except (TypeError, ValueError) as exc:
        canonical = _canonical_fallback(value)
        note = f"arguments_digest: orjson refused the arguments ({exc}); digest of the fallback canonical form"
    return "sha256:" + hashlib.sha256(canonical).hexdigest(), note


def _canonical_fallback(value: Any) -> bytes:
    out: list[bytes] = []
    # A stack of pending work: bytes are written as they are, anything else is a value still to encode.
    stack: list[Any] = [_Pending(value)]
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):
            out.append(item)
            continue
        node = item.value
        if isinstance(node, Mapping):
            pairs = sorted(((k if isinstance(k, str) else str(k)), v) for k, v in _mapping_items(node))
            stack.append(b"}")
            for index in range(len(pairs) - 1, -1, -1):
                key, child = pairs[index]
                stack.append(_Pending(child))
                stack.append(_json_string(key) + b":")
                if index:
                    stack.append(b",")
            stack.append(b"{")
        elif isinstance(node, list | tuple):
            stack.append(b"]")
            for index in range(len(node) - 1, -1, -1):
                stack.append(_Pending(node[index]))
                if index:
                    stack.append(b",")
            stack.append(b"[")
        else:
            out.append(_json_scalar(node))
    return b"".join(out)


class _Pending:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _mapping_items(node: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    return list(node.items())


def _json_string(text: str) -> bytes:
    # backslashreplace writes a lone surrogate as \udXXX: the JSON escape that denotes it.
    return json.dumps(text, ensure_ascii=False).encode("utf-8", "backslashreplace")


def _json_scalar(value: Any) -> bytes:
    if value is None:
        return b"null"
    if value is True:
        return b"true"
    if value is False:
        return b"false"
    if isinstance(value, int):
        # Python refuses to print integers past ~4300 digits; such a number is summarised, not lost silently.
        return str(value).encode() if value.bit_length() < 14_000 else \
            _json_string(f"<integer of {value.bit_length()} bits>")
    if isinstance(value, float):
        return repr(value).encode() if math.isfinite(value) else b"null"
    if isinstance(value, str):
        return _json_string(value)
    return _json_string(_unjsonable(value))


def as_outcome(name: str) -> Outcome:
    """``name`` if it is a known outcome, else ``"error"`` (a new pipeline outcome must never lose a record)."""
    return cast(Outcome, name) if name in _DECISIONS else "error"


def call_verdict(record: CallRecord, outcome: Outcome | None, error: BaseException | None) -> tuple[Outcome, Decision]:
    """The outcome and decision a ``tool.call`` record carries: ``outcome`` (else ``classify_outcome``), and
    ``sanitized`` for an allowed call the sanitizer changed. Also what the call's metrics count, with or without a
    record."""
    out: Outcome = outcome if outcome is not None else classify_outcome(record, error)
    if out == "allowed" and any(record.sanitize.values()):
        out = "sanitized"
    return out, _DECISIONS[out]


def record_stage(record: CallRecord) -> str:
    """The stage a ``tool.call`` record names: where the call ended."""
    return _short(record.stage, 64)


def classify_outcome(record: CallRecord | None, error: BaseException | None) -> Outcome:
    """Name what happened to a call from the error that ended it (``None`` when it completed)."""
    if error is None:
        return "sanitized" if record is not None and any(record.sanitize.values()) else "allowed"
    if isinstance(error, asyncio.CancelledError | ConnectionError):
        return "client_disconnected"
    if isinstance(error, RateLimited):
        return "rate_limited"
    if isinstance(error, LimiterUnavailable):
        return "limiter_unavailable"
    if isinstance(error, UpstreamTimeout):
        return "timeout"
    if isinstance(error, UpstreamUnavailable):
        return "upstream_unavailable"
    if isinstance(error, UpstreamRpcError):
        return "upstream_error"
    if isinstance(error, AuditUnavailable):
        return "audit_unavailable"
    stage = record.stage if record is not None else None
    if stage in ("input_schema", "parse"):
        return "invalid_input"
    if stage == "output_schema":
        return "invalid_output"
    # The error says what it means (``RequestError.outcome``): a stage-name table here went stale when guards
    # were renamed (a quarantined tool's call was recorded as an error, not a denial).
    if isinstance(error, RequestError) and error.outcome is not None:
        return error.outcome
    if isinstance(error, ToolError | HttpError):
        return "denied"
    return "error"


def call_record(
    ctx: CallContext | None,
    record: CallRecord | None,
    *,
    started_at: float,
    total_ms: float,
    event: str = "tool.call",
    outcome: Outcome | None = None,
    error: BaseException | None = None,
    upstream_ms: float | None = None,
    request_id: str | int | None = None,
    call_id: str | None = None,
    session: str | None = None,
    era: Era | None = None,
    principal: Principal | None = None,
    client_info: Mapping[str, Any] | None = None,
    traceparent: str | None = None,
    public_tool: str | None = None,
    upstream: str | None = None,
    original_tool: str | None = None,
    arguments: Mapping[str, Any] | None = None,
    result: Mapping[str, Any] | None = None,
    log_arguments: bool = False,
    redact: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """The ``tool.call`` record for one call, whatever happened to it.

    Identity fields come from ``ctx``; the keyword arguments fill them in when there is no context yet (a call
    to an unknown tool) and override it otherwise. ``outcome`` defaults to ``classify_outcome(record, error)``;
    the decision follows from the outcome. ``result`` is the result returned to the client (after response
    guards), or ``None`` when none was.
    """
    rec = record if record is not None else CallRecord()
    out, decision = call_verdict(rec, outcome, error)
    if ctx is not None:
        request_id = request_id if request_id is not None else ctx.client_id
        call_id = call_id if call_id is not None else ctx.request_id
        session = session if session is not None else ctx.session_id
        era = era if era is not None else ctx.era
        principal = principal if principal is not None else ctx.principal
        client_info = client_info if client_info is not None else ctx.client_info
        traceparent = traceparent if traceparent is not None else ctx.traceparent
        public_tool = public_tool if public_tool is not None else ctx.tool.public_name
        upstream = upstream if upstream is not None else ctx.tool.upstream
        original_tool = original_tool if original_tool is not None else ctx.tool.original_name
        arguments = arguments if arguments is not None else ctx.arguments
    up_ms = upstream_ms if upstream_ms is not None else rec.upstream_ms
    stage = record_stage(rec)

    doc = _envelope(event, started_at, request_id=request_id, session=session, era=era, principal=principal,
                    client_info=client_info, traceparent=traceparent)
    doc["call_id"] = _short_or_none(call_id)
    # An unknown tool has neither upstream nor original name: null, as documented (never "").
    doc["tool"] = {"name": _short(public_tool), "upstream": _short_or_none(upstream or None),
                   "original": _short_or_none(original_tool or None)}
    doc["decision"] = decision
    doc["outcome"] = out
    doc["stage"] = stage
    doc["rule_id"] = rec.rule_id
    doc["reason"] = rec.reason if rec.reason is not None or error is None else _error_reason(error)
    doc["limit"] = rec.limit
    # Most calls have no violations, shadow denies or sanitizer counts: the empty cases skip the loops.
    doc["violations"] = [_short(v, _MAX_STRING) for v in rec.violations] if rec.violations else []
    doc["shadow_denies"] = list(rec.shadow) if rec.shadow else []
    doc["sanitize"] = {str(k): int(v) for k, v in rec.sanitize.items()} if rec.sanitize else {}
    if rec.extra:
        extra = rec.extra
        if "flow" in extra:
            # A denial by a flow rule: the earlier calls (tool, time, call_id) that set each label it reads.
            doc["flow"] = extra["flow"]
        if "held_over" in extra:
            # The call ended while the upstream may still run it: these caps keep its slot until the upstream is done.
            doc["held_over"] = [_short(str(name)) for name in extra["held_over"]]
        if extra.get("ratelimit_degraded") is True:
            # Let through uncounted: the limiter's Redis failed and failure_mode is open.
            doc["ratelimit_degraded"] = True
        if isinstance(wait := extra.get("refresh_wait_ms"), int | float):
            # How long the call waited for its upstream's changed definitions to be checked (the refresh gate).
            doc["refresh_wait_ms"] = float(wait)
    doc["error"] = None if error is None else _error_summary(error)
    if error is not None and redact is not None:
        # An error's message may quote what the caller typed (an unknown tool's name): the secret rules first,
        # as for logged arguments. Only refused or failed calls pay for it.
        summary = doc["error"]
        if summary is not None and "message" in summary:
            summary["message"] = _redacted(summary["message"], redact, _MAX_STRING)
        doc["reason"] = _redacted(doc["reason"], redact, _MAX_STRING)
    doc["arguments_digest"], note = _digest(arguments)
    if log_arguments:
        doc["arguments"] = _logged_arguments(arguments, redact)
    doc["result"] = None if result is None else _result_summary(result)
    doc["latency_ms"] = _latency(total_ms, up_ms)
    if rec.approval is not None:
        doc["approval"] = _approval_summary(rec.approval)
    if rec.audit_error or note:
        doc["audit_error"] = _short("; ".join(p for p in (rec.audit_error, note) if p), _MAX_STRING)
    return doc


def fallback_call_record(ctx: CallContext | None, record: CallRecord | None, *, started_at: float, total_ms: float,
                         outcome: Outcome, problem: str) -> dict[str, Any]:
    """A ``tool.call`` record built from identity fields only, for when ``call_record`` itself failed: the
    call is still recorded, with ``audit_error`` saying what could not be computed."""
    tool = ctx.tool if ctx is not None else None
    doc = _envelope("tool.call", started_at if math.isfinite(started_at) else 0.0,
                    request_id=ctx.client_id if ctx is not None else None,
                    session=ctx.session_id if ctx is not None else None,
                    era=ctx.era if ctx is not None else None,
                    principal=ctx.principal if ctx is not None else None, client_info=None, traceparent=None)
    out = outcome if outcome in _DECISIONS else "error"
    doc.update({
        "call_id": _short_or_none(ctx.request_id if ctx is not None else None),
        "tool": {"name": _short(tool.public_name if tool else None),
                 "upstream": _short_or_none(tool.upstream or None if tool else None),
                 "original": _short_or_none(tool.original_name or None if tool else None)},
        "decision": _DECISIONS[out], "outcome": out,
        "stage": _short(record.stage if record is not None else None, 64),
        "rule_id": _short_or_none(record.rule_id if record is not None else None),
        "reason": None, "limit": None, "violations": [], "shadow_denies": [], "sanitize": {}, "error": None,
        "arguments_digest": "sha256:" + hashlib.sha256(b"").hexdigest(), "result": None,
        "latency_ms": _latency(total_ms, None),
        "audit_error": _short(f"record: {problem}; only identity fields were recorded", _MAX_STRING),
    })
    return doc


def tools_list_record(*, at: float, shown: int, hidden: int, request_id: str | int | None, session: str | None,
                      era: Era | None, principal: Principal | None, client_info: Mapping[str, Any] | None = None,
                      traceparent: str | None = None, upstreams_failed: Sequence[str] = ()) -> dict[str, Any]:
    """``tools.list``: how many tools the principal was shown and how many policy hid from it."""
    doc = _envelope("tools.list", at, request_id=request_id, session=session, era=era, principal=principal,
                    client_info=client_info, traceparent=traceparent)
    doc["shown"] = int(shown)
    doc["hidden"] = int(hidden)
    doc["upstreams_failed"] = sorted(_short(u) for u in upstreams_failed)
    return doc


class RequestTarget(NamedTuple):
    """What a forwarded request other than ``tools/call`` was for: the prompt's public name (a completion's too),
    the resource's public URI (a template's, for a completion), the upstream and the upstream's own name or URI.
    ``upstream`` and ``original`` are ``None`` while (or because) the target was not resolved."""

    name: str | None = None
    uri: str | None = None
    upstream: str | None = None
    original: str | None = None


# Where a forwarded request other than ``tools/call`` ended, in order: its params were unreadable; its target was
# unknown or hidden; the limiter refused it; the upstream failed it; it completed.
REQUEST_STAGES = ("parse", "resolve", "ratelimit", "forward", "complete")


def request_outcome(stage: str, error: BaseException | None) -> Outcome:
    """What a ``request`` record's outcome is: a ``tool.call``'s word for the same end. A refusal at ``parse`` is
    ``invalid_input``, as for a call; one at ``resolve`` that names no outcome of its own is ``denied`` (unknown
    or hidden)."""
    out = classify_outcome(None, error)
    if stage == "parse" and isinstance(error, RequestError) and out != "audit_unavailable":
        return "invalid_input"  # refused with its request, as a tools/call refused there is
    if out == "error" and stage == "resolve" and isinstance(error, RequestError):
        return "denied"
    return out


def request_record(*, at: float, method: str, target: RequestTarget, stage: str, total_ms: float,
                   upstream_ms: float | None, error: BaseException | None, result: Mapping[str, Any] | None,
                   reason: str | None, request_id: str | int | None, session: str | None, era: Era | None,
                   principal: Principal | None, client_info: Mapping[str, Any] | None = None,
                   traceparent: str | None = None, ratelimit_degraded: bool = False,
                   redact: Callable[[str], str] | None = None) -> dict[str, Any]:
    """``request``: how one forwarded request other than ``tools/call`` ended, whatever the end, in the words of a
    ``tool.call`` record (``decision``, ``outcome``, ``stage``, ``limit``, ``reason``, ``error``, ``latency_ms``,
    ``ratelimit_degraded``); ``result`` says how much went back (never what).

    A URI or name is what the caller typed (a template's URI is as free as a tool's arguments), and the error
    message and reason quote it: each goes through ``redact`` (the sanitizer's secret rules) before it is
    written, as logged arguments do, so the audit log never keeps a secret the caller put in a URI."""
    doc = _envelope("request", at, request_id=request_id, session=session, era=era, principal=principal,
                    client_info=client_info, traceparent=traceparent)
    outcome = request_outcome(stage, error)
    summary = _error_summary(error)
    if summary is not None and "message" in summary:
        summary["message"] = _redacted(summary["message"], redact, _MAX_STRING)
    why = reason if reason is not None else _error_reason(error)
    doc.update(method=_short(method),
               target={"name": _redacted(target.name, redact), "uri": _redacted(target.uri, redact),
                       "upstream": _short_or_none(target.upstream), "original": _redacted(target.original, redact)},
               decision=_DECISIONS[outcome], outcome=outcome, stage=_short(stage, 64),
               limit=_short_or_none(error.limit) if isinstance(error, RateLimited) else None,
               reason=_redacted(why, redact, _MAX_STRING),
               error=summary,
               result=None if error is not None or result is None else _request_result_summary(result),
               latency_ms=_latency(total_ms, upstream_ms))
    if ratelimit_degraded:
        # Let through uncounted (the limiter's Redis failed, failure_mode open), as a tool.call record says.
        doc["ratelimit_degraded"] = True
    return doc


def _request_result_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """``{items, bytes, digest}`` of what went back: the contents read, the prompt's messages or the completion's
    values counted, and the size and SHA-256 of the result's canonical JSON (one encoding), so a read can be
    matched against a copy of the resource without the record holding it."""
    items: Any = result.get("contents", result.get("messages"))
    completion = result.get("completion")
    if items is None and isinstance(completion, Mapping):
        items = completion.get("values")
    encoded = canonical_json(result)
    return {"items": len(items) if isinstance(items, list) else 0, "bytes": len(encoded),
            "digest": "sha256:" + hashlib.sha256(encoded).hexdigest()}


def session_record(event: Literal["session.start", "session.end"], *, at: float, session: str, era: Era | None,
                   principal: Principal | None, client_info: Mapping[str, Any] | None = None,
                   protocol_version: str | None = None, reason: str | None = None,
                   duration_ms: float | None = None) -> dict[str, Any]:
    """``session.start`` / ``session.end``. ``reason`` says why a session ended (``deleted``, ``expired``...)."""
    doc = _envelope(event, at, request_id=None, session=session, era=era, principal=principal,
                    client_info=client_info, traceparent=None)
    doc["protocol_version"] = _short_or_none(protocol_version)
    doc["reason"] = _short_or_none(reason)
    doc["duration_ms"] = None if duration_ms is None else round(max(0.0, duration_ms), 3)
    return doc


def policy_reload_record(*, at: float, outcome: Literal["applied", "rejected", "unchanged"], source: str,
                         digest: str | None = None, rules: int | None = None,
                         error: str | None = None) -> dict[str, Any]:
    """``policy.reload``: which file, whether it took effect, and why not (the ``ConfigError`` text)."""
    doc = _envelope("policy.reload", at, request_id=None, session=None, era=None, principal=None,
                    client_info=None, traceparent=None)
    doc.update(outcome=outcome, source=_short(source, _MAX_STRING), digest=digest, rules=rules,
               error=None if error is None else _short(error, _MAX_STRING))
    return doc


def pin_drift_record(*, at: float, upstream: str, tool: str, pinned: str, observed: str,
                     action: Literal["blocked", "warned"]) -> dict[str, Any]:
    """``pin.drift``: an upstream changed a pinned tool's definition (fingerprints, not definitions)."""
    doc = _envelope("pin.drift", at, request_id=None, session=None, era=None, principal=None, client_info=None,
                    traceparent=None)
    doc.update(upstream=_short(upstream), tool=_short(tool), pinned=_short(pinned), observed=_short(observed),
               action=action)
    return doc


def pin_approve_record(*, at: float, upstream: str, tool: str, fingerprint: str,
                       approved_by: str | None) -> dict[str, Any]:
    """``pin.approve``: an operator accepted a tool definition (``approved_by`` is who, when known)."""
    doc = _envelope("pin.approve", at, request_id=None, session=None, era=None, principal=None, client_info=None,
                    traceparent=None)
    doc.update(upstream=_short(upstream), tool=_short(tool), fingerprint=_short(fingerprint),
               approved_by=_short_or_none(approved_by))
    return doc


# What guards leave in ``CallRecord.extra``: the keys ``call_record`` writes into the record when present, and those
# meant for other readers (the tracing span). A key in neither would be dropped from the record without a word:
# tests/audit/test_record_extra.py finds every key the code writes and fails on one in neither.
RECORD_EXTRA = frozenset({"flow", "held_over", "ratelimit_degraded", "refresh_wait_ms"})
NOT_RECORDED_EXTRA = frozenset({"upstream_is_error"})  # the record has the result's isError itself


def admin_action_record(*, at: float, admin: Principal | None, action: str, target: str | None, outcome: str,
                        detail: str | None = None, remote_addr: str | None = None) -> dict[str, Any]:
    """``admin.action``: something an admin did in the console (log in, approve or reject a pin, explain a
    policy decision), with the admin as the principal, so the audit log alone says who did what."""
    doc = _envelope("admin.action", at, request_id=None, session=None, era=None, principal=admin, client_info=None,
                    traceparent=None)
    doc.update(action=_short(action), target=_short_or_none(target), outcome=_short(outcome),
               detail=_short_or_none(detail, 4096), remote_addr=_short_or_none(remote_addr))
    return doc


def catalogue_limit_record(*, at: float, drop: LimitDrop) -> dict[str, Any]:
    """``catalogue.limit``: items of an upstream's list dropped by one ``catalogue.limits`` bound (``dropped`` 0:
    the listing was cut short by ``max_pages`` or ``max_list_size``); ``items`` names the first few."""
    doc = _envelope("catalogue.limit", at, request_id=None, session=None, era=None, principal=None,
                    client_info=None, traceparent=None)
    doc.update(upstream=_short(drop.upstream), list=drop.list, limit=drop.limit, bound=drop.bound,
               dropped=drop.dropped, items=[_short(name) for name in drop.names])
    return doc


def auth_failure_record(*, at: float, reason: AuthFailureReason, method: str | None, remote_addr: str | None,
                        key_id: str | None = None, traceparent: str | None = None,
                        principal: Principal | None = None, session: str | None = None,
                        era: Era | None = None) -> dict[str, Any]:
    """``auth.failure``: the class of failure and where from, never the credential itself.

    ``key_id`` is the public identifier of a presented API key or the ``kid``/``sub`` of a token whose signature
    was checked; pass ``None`` when the credential could not be parsed (the raw bytes might be the secret).
    ``principal``, ``session`` and ``era`` are set only when an open stream's credential, presented again, failed:
    the principal it had authenticated (``server/standing.py``).
    """
    doc = _envelope("auth.failure", at, request_id=None, session=session, era=era, principal=principal,
                    client_info=None, traceparent=traceparent)
    doc.update(reason=reason, method=_short_or_none(method), remote_addr=_short_or_none(remote_addr),
               key_id=_short_or_none(key_id))
    return doc


def definition_finding_record(*, at: float, upstream: str, item_kind: str, item: str, finding: str, action: str,
                              fields: Sequence[str] = (), count: int = 1) -> dict[str, Any]:
    """``definition.finding``: one finding class in one definition (tool, prompt, resource, template,
    instructions) and what bastion did about it (``flagged``, ``neutralised``, ``blocked``). ``fields`` are the
    paths where it was found, never the text."""
    doc = _envelope("definition.finding", at, request_id=None, session=None, era=None, principal=None,
                    client_info=None, traceparent=None)
    doc.update({"upstream": _short(upstream), "item_kind": _short(item_kind), "item": _short(item),
                "class": _short(finding), "action": _short(action),
                "fields": sorted({_short(f) for f in fields})[:20], "count": max(1, int(count))})
    return doc


def catalogue_drop_record(*, at: float, upstream: str, item_kind: str, item: str, reason: str,
                          action: str) -> dict[str, Any]:
    """``catalogue.drop``: an item an upstream offered that clients do not get as offered (``dropped`` from the
    catalogue, or ``quarantined``: listed nowhere and refused on call), with the reason."""
    doc = _envelope("catalogue.drop", at, request_id=None, session=None, era=None, principal=None,
                    client_info=None, traceparent=None)
    doc.update(upstream=_short(upstream), item_kind=_short(item_kind), item=_short(item),
               reason=_short(reason, _MAX_STRING), action=_short(action))
    return doc


def http_refused_record(*, at: float, status: int, reason: str, detail: str | None, remote_addr: str | None,
                        method: str | None, path: str | None, suppressed: int = 0,
                        traceparent: str | None = None) -> dict[str, Any]:
    """``http.refused``: the front door refused a request before it was understood (often before
    authentication). ``suppressed`` counts the records of the same ``reason`` the rate limit dropped since the
    previous one."""
    doc = _envelope("http.refused", at, request_id=None, session=None, era=None, principal=None,
                    client_info=None, traceparent=traceparent)
    doc.update(status=status, reason=_short(reason), detail=_short_or_none(detail, _MAX_STRING),
               remote_addr=_short_or_none(remote_addr), method=_short_or_none(method),
               path=_short_or_none(path), suppressed=max(0, int(suppressed)))
    return doc


def _envelope(event: str, at: float, *, request_id: str | int | None, session: str | None, era: Era | None,
              principal: Principal | None, client_info: Mapping[str, Any] | None,
              traceparent: str | None) -> dict[str, Any]:
    trace = parse_traceparent(traceparent)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "audit",
        "time": rfc3339(at),
        "event": event,
        "request_id": _request_id(request_id),
        "session": _short_or_none(session),
        "era": era,
        "principal": None if principal is None else {
            "id": _short(principal.id),
            "groups": sorted(_short(g) for g in principal.groups) if principal.groups else [],
            "auth_method": principal.auth_method,
        },
        # name and version only: clientInfo may carry free text (description, icons, URLs) the audit needs not.
        "client": None if not client_info else {
            "name": _short_or_none(_str_or_none(client_info.get("name"))),
            "version": _short_or_none(_str_or_none(client_info.get("version"))),
        },
        "trace": None if trace is None else {"trace_id": trace.trace_id, "span_id": trace.span_id,
                                             "sampled": trace.sampled},
    }


def _error_summary(error: BaseException | None) -> dict[str, Any] | None:
    if error is None:
        return None
    summary: dict[str, Any] = {"type": type(error).__name__}
    code = getattr(error, "code", None)
    if isinstance(error, RequestError):
        summary["plane"] = error.plane
        # The client-facing message is written to be safe to show; log_detail stays in the gateway log.
        summary["message"] = _short(error.message, _MAX_STRING)
    if isinstance(code, int):
        summary["code"] = code
    return summary


def _error_reason(error: BaseException | None) -> str | None:
    if isinstance(error, RequestError):
        return _short(error.message, _MAX_STRING)
    return None


def _result_summary(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if result is None:
        return None
    content = result.get("content")
    items = content if isinstance(content, list) else []
    types = sorted({_short(str(item.get("type"))) for item in items if isinstance(item, Mapping)})
    return {
        "is_error": result.get("isError") is True,
        "content_types": types,
        "content_items": len(items),
        "bytes": _encoded_size(result),
        "structured": result.get("structuredContent") is not None,
    }


def _encoded_size(result: Mapping[str, Any]) -> int:
    """The length of ``canonical_json(result)``: sorting keys moves bytes but never adds any, so orjson's plain
    encoding (no sort) has the same length when it can encode the result at all."""
    try:
        return len(orjson.dumps(result))
    except (TypeError, ValueError):
        return len(canonical_json(result))


def _latency(total_ms: float, upstream_ms: float | None) -> dict[str, float | None]:
    total = _ms(total_ms)
    up = None if upstream_ms is None else _ms(upstream_ms)
    # Clamp: clocks are read at different points, and the overhead must never come out negative.
    overhead = total if up is None else max(0.0, _ms(total - up))
    return {"total": total, "upstream": up, "overhead": overhead}


def _ms(value: float) -> float:
    """``value`` to the microsecond (three decimals of a millisecond); 0 for what is not a positive number.

    ``round(value * 1000) / 1000`` rather than ``round(value, 3)``, which formats the float as decimal text to
    round it correctly: several times the cost, for a difference in the last digit only when ``value`` lies
    within a rounding error of a half microsecond (every record has three of these)."""
    if 0 < value < 1e15:  # past that (31,000 years), value * 1000 could not be rounded to an int exactly
        return round(value * 1000) / 1000
    return round(value, 3) if 0 < value < math.inf else 0.0


def logged_arguments(arguments: Any, redact: Callable[[str], str] | None = None) -> dict[str, Any]:
    """Arguments as a record logs them when ``audit.log_arguments`` is on: secret-looking keys masked, strings
    through ``redact`` and capped. Shared with the admin console, which shows arguments by the same rule."""
    return _logged_arguments(arguments, redact)


def _logged_arguments(arguments: Any, redact: Callable[[str], str] | None) -> dict[str, Any]:
    value = _redact_value(arguments if arguments is not None else {}, redact, None, 0)
    return value if isinstance(value, dict) else {"": value}


def _redact_value(value: Any, redact: Callable[[str], str] | None, key: str | None, depth: int) -> Any:
    """The value as it may be logged: redacted, capped, and always encodable (orjson must not refuse a record)."""
    if key is not None and any(hint in key.lower() for hint in _SECRET_KEY_HINTS):
        return _MASK
    if isinstance(value, str):
        try:
            text = redact(value) if redact is not None else value
        except Exception:  # an admin's redactor that fails must not cost the record: mask what it could not vet
            return _MASK
        return _short(text, _MAX_STRING)
    if isinstance(value, Mapping | list | tuple) and depth >= _MAX_LOGGED_DEPTH:
        return _DEEPER
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            name = _short(k if isinstance(k, str) else str(k))
            out[name] = _redact_value(v, redact, name, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_redact_value(v, redact, None, depth + 1) for v in value]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -2**63 <= value < 2**63 else _short(f"<integer of {value.bit_length()} bits>")
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return _short(_unjsonable(value), _MAX_SHORT)


def _request_id(value: Any) -> str | int | None:
    """The client's JSON-RPC id as sent: an integer stays an integer, a string is capped like other strings."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return value
    return _short(value if isinstance(value, str) else str(value))


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _short(value: Any, limit: int = _MAX_SHORT) -> str:
    """``value`` as a capped, encodable string (lone surrogates replaced): total, whatever ``value`` is."""
    if type(value) is str and len(value) <= limit and value.isascii():
        return value  # the common case: nothing to replace, nothing to cut
    if value is None:
        return ""
    text = printable(value if isinstance(value, str) else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short_or_none(value: Any, limit: int = _MAX_SHORT) -> str | None:
    return None if value is None else _short(value, limit)


def _redacted(value: str | None, redact: Callable[[str], str] | None, limit: int = _MAX_SHORT) -> str | None:
    """``value`` through ``redact``, then capped; masked whole when the redactor fails (it could not vet it)."""
    if value is None or redact is None:
        return _short_or_none(value, limit)
    try:
        # Made encodable first: a lone surrogate is the caller's too, and the rules read text, not code points.
        return _short(redact(printable(value)), limit)
    except Exception:
        return _MASK


def _unjsonable(value: Any) -> str:
    try:
        return printable(repr(value))
    except Exception:
        return f"<{type(value).__name__}>"


def _approval_summary(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The ``approval`` object of a held call: which rule held it, who could approve, how it ended."""
    waited = facts.get("waited_ms")
    return {"id": _short_or_none(facts.get("id")), "rule_id": _short_or_none(facts.get("rule_id")),
            "via": [_short(v, 16) for v in facts.get("via") or ()],
            "outcome": _short_or_none(facts.get("outcome")), "channel": _short_or_none(facts.get("channel")),
            "by": _short_or_none(facts.get("by")),
            "waited_ms": float(waited) if isinstance(waited, int | float) else 0.0}


def approval_record(event: str, *, at: float, decider: Principal | None, approval_id: str, principal: str | None,
                    tool: str | None,
                    upstream: str | None, rule_id: str | None, outcome: str | None = None,
                    channel: str | None = None, by: str | None = None) -> dict[str, Any]:
    """An ``approval.decided`` record: an approver's answer, written where it was given (the call's own
    ``tool.call`` record, on the waiting replica, carries the outcome as well)."""
    doc = _envelope(event, at, request_id=None, session=None, era=None, principal=decider, client_info=None,
                    traceparent=None)
    doc["approval"] = {"id": _short(approval_id), "principal": _short_or_none(principal),
                       "tool": _short_or_none(tool), "upstream": _short_or_none(upstream),
                       "rule_id": _short_or_none(rule_id), "outcome": _short_or_none(outcome),
                       "channel": _short_or_none(channel), "by": _short_or_none(by)}
    return doc
