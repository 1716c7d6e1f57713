"""Refusals of the front door, visible to operators: counted, logged and audited, without letting a flood fill
the disk.

Every refusal (from the HTTP protocol below the app, or from the endpoint's own checks) is counted in
``bastion_http_refusals_total{reason}``, always. The ``http.refused`` audit record and its log line are
rate-limited by a token bucket per reason: a burst passes, then about ``per_minute`` records a minute; what the
bucket drops is counted and reported as ``suppressed`` in the next record written for that reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, get_args

import structlog

from bastion.audit.record import http_refused_record
from bastion.bucket import TokenBucket
from bastion.errors import Refused

__all__ = ["REFUSAL_REASONS", "RefusalReason", "RefusalReporter", "TokenBucket"]

log = structlog.get_logger("bastion.http")

RefusalReason = Literal[
    "host",  # Host (or an absolute-form target's authority) missing, malformed, or not one a loopback listener
    # answers to (400/421), on any path
    "origin",  # Origin malformed or not allowed (403)
    "duplicate_header",  # a header that must appear once appears more often (400)
    "content_type",  # a POST body that is not application/json (415)
    "body_too_large",  # 413
    "header_too_large",  # header section over listen.max_header_size (431)
    "too_many_headers",  # over listen.max_headers (431)
    "uri_too_long",  # request target over listen.max_target_size (414)
    "transfer_encoding",  # a transfer coding other than plain chunked (501), or one in HTTP/1.0 (400)
    "method",  # a method the HTTP parser does not know (501)
    "request_timeout",  # headers and body not received within listen.request_timeout (408, or closed)
    "malformed",  # not parseable as HTTP/1.1 (400)
]
REFUSAL_REASONS: tuple[str, ...] = get_args(RefusalReason)


class RefusalReporter:
    """Counts every refusal; writes a rate-limited ``http.refused`` record (and log line) per reason.

    ``count(reason)`` increments the metric; ``emit_soon(record)`` hands a record to the audit log without
    waiting (refusals are reported from protocol callbacks, which cannot await).
    """

    def __init__(self, *, count: Callable[[str], None], emit_soon: Callable[[dict[str, Any]], None],
                 burst: int = 20, per_minute: int = 12, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._count = count
        self._emit_soon = emit_soon
        self._burst = burst
        self._rate = per_minute / 60.0
        self._clock = clock
        self._wall = wall
        self._buckets: dict[str, TokenBucket] = {}
        self._suppressed: dict[str, int] = {}

    def report(self, refusal: Refused, remote_addr: str | None, method: str | None, path: str | None,
               traceparent: str | None = None) -> None:
        reason = refusal.reason if refusal.reason in REFUSAL_REASONS else "malformed"
        self._count(reason)
        bucket = self._buckets.get(reason)
        if bucket is None:
            bucket = self._buckets[reason] = TokenBucket(float(self._burst), self._rate)
        if not bucket.take(self._clock()):
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        suppressed = self._suppressed.pop(reason, 0)
        log.info("http.refused", status=refusal.status, reason=reason, detail=refusal.log_detail or refusal.message,
                 remote_addr=remote_addr, suppressed=suppressed)
        self._emit_soon(http_refused_record(
            at=self._wall(), status=refusal.status, reason=reason, detail=refusal.log_detail or refusal.message,
            remote_addr=remote_addr, method=method, path=path, suppressed=suppressed, traceparent=traceparent))
