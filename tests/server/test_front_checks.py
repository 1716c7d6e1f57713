"""The front door's pure header checks: header shape, Host and Origin authorities, media type, declared size;
and the rate-limited refusal reporter."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.audit.record import http_refused_record
from bastion.auth.credentials import CREDENTIAL_SOURCES
from bastion.errors import HEADER_MISMATCH, INVALID_REQUEST, Refused
from bastion.server.checks import (
    SINGLETON_HEADERS,
    AcceptCheck,
    FrontHeaders,
    HostCheck,
    accepts,
    check_content_type,
    check_declared_length,
    check_host,
    check_origin,
    front_headers,
    parse_authority,
)
from bastion.server.refusals import REFUSAL_REASONS, RefusalReporter, TokenBucket
from bastion.settings import ListenConfig
from tests.audit.helpers import assert_valid

LOOPBACK = ListenConfig()
PUBLIC = ListenConfig(host="0.0.0.0", allowed_origins=("https://app.example.com",))


def refused(fn: Any, *args: Any) -> Refused:
    with pytest.raises(Refused) as info:
        fn(*args)
    return info.value


# -- header shape ---------------------------------------------------------------------------------------------


def test_every_header_a_credential_is_read_from_is_a_singleton() -> None:
    """Built from what the authenticator reads, so a credential source added there is covered here too."""
    assert CREDENTIAL_SOURCES
    for name in CREDENTIAL_SOURCES:
        assert name.encode() in SINGLETON_HEADERS
        exc = refused(front_headers, [(b"host", b"localhost"), (name.encode(), b"a"), (name.upper().encode(), b"b")])
        assert (exc.status, exc.reason) == (400, "duplicate_header")


@pytest.mark.parametrize("name", ["Authorization", "X-API-Key", "Mcp-Session-Id", "MCP-Protocol-Version", "Mcp-Method",
                                  "Mcp-Name", "Origin", "Host", "Content-Type"])
def test_a_second_copy_of_a_singleton_header_is_400(name: str) -> None:
    raw = [(b"host", b"localhost"), (name.encode(), b"a"), (name.lower().encode(), b"a")]
    if name == "Host":
        raw = raw[1:]
    exc = refused(front_headers, raw)
    assert exc.status == 400
    assert exc.reason == "duplicate_header"
    assert name.lower() in exc.message
    assert exc.code == (HEADER_MISMATCH if name.lower().startswith("mcp-") and name != "Mcp-Session-Id"
                        else INVALID_REQUEST)


def test_repeatable_headers_pass_and_values_lose_their_optional_whitespace() -> None:
    out = front_headers([(b"Accept", b"application/json"), (b"accept", b" text/event-stream"),
                         (b"Mcp-Name", b"  \techo \t "), (b"X-Empty", b"   ")])
    assert out == [(b"accept", b"application/json"), (b"accept", b"text/event-stream"), (b"mcp-name", b"echo"),
                   (b"x-empty", b"")]


# -- Host and Origin ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("localhost", ("localhost", None)), ("LocalHost:8080", ("localhost", 8080)), ("127.0.0.1:1", ("127.0.0.1", 1)),
    ("[::1]:8080", ("::1", 8080)), ("[0:0::1]", ("::1", None)), ("a-b.example_x.com.", ("a-b.example_x.com.", None)),
])
def test_well_formed_authorities(value: str, expected: tuple[str, int | None]) -> None:
    assert parse_authority(value) == expected


@pytest.mark.parametrize("value", [
    "", "localhost:1.attacker.example", "localhost:", "localhost:0", "localhost:65536", "localhost:+80",
    "localhost:8080:1", "user@localhost", "localhost/x", "local host", "[::1", "[::1]x", "[127.0.0.1]", "127.1",
    "0x7f.0.0.1", "127.000.000.001", "2130706433", "example.123", "-bad.example", "bad-.example", "a..b",
    "a" * 64 + ".example", "%6cocalhost", "localhost\t", "ünïcode.example",
])
def test_malformed_authorities(value: str) -> None:
    assert parse_authority(value) is None


def test_host_must_be_present_well_formed_and_loopback_on_a_loopback_listener() -> None:
    check_host("localhost:8080", LOOPBACK)
    check_host("[::1]:8080", LOOPBACK)
    assert refused(check_host, None, LOOPBACK).status == 400
    assert refused(check_host, "localhost:1.attacker.example", LOOPBACK).status == 400
    assert refused(check_host, "attacker.example", LOOPBACK).status == 421
    assert refused(check_host, "127.1", PUBLIC).status == 400
    check_host("attacker.example", PUBLIC)
    check_host("gw.internal:8080", ListenConfig(allowed_hosts=("gw.internal",)))
    assert all(refused(check_host, h, LOOPBACK).reason == "host" for h in (None, "a:b", "x.example"))


@pytest.mark.parametrize("origin", ["http://localhost:8080", "https://127.0.0.1", "http://[::1]:3000",
                                    "HTTP://LOCALHOST:8080"])
def test_loopback_origins_pass_on_a_loopback_listener(origin: str) -> None:
    check_origin(origin, LOOPBACK)


@pytest.mark.parametrize("origin", [
    "http://localhost:1.attacker.example", "http://localhost.attacker.example", "http://localhost@attacker.example",
    "http://localhost/", "http://localhost:8080/path", "file://localhost", "null", "localhost:8080",
    "http://127.0.0.1.nip.io", "http://0x7f000001", "ws://localhost", "http://localhost:99999",
])
def test_anything_else_is_403_even_when_a_lax_parser_would_see_loopback(origin: str) -> None:
    exc = refused(check_origin, origin, LOOPBACK)
    assert (exc.status, exc.reason) == (403, "origin")


def test_configured_origins_compare_as_origins() -> None:
    check_origin("https://app.example.com", PUBLIC)
    check_origin("HTTPS://App.Example.com:443", PUBLIC)
    assert refused(check_origin, "https://app.example.com:8443", PUBLIC).status == 403
    assert refused(check_origin, "http://localhost:8080", PUBLIC).status == 403  # not a loopback listener
    check_origin(None, PUBLIC)
    check_origin("null", ListenConfig(allowed_origins=("null",)))


# -- media type and size --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["application/json", "Application/JSON", "application/json; charset=utf-8",
                                   "application/json;charset=\"UTF-8\"", "application/json ; foo=bar",
                                   "application/json;"])
def test_json_media_types_pass(value: str) -> None:
    check_content_type(value)


@pytest.mark.parametrize("value", [None, "", "text/plain", "application/jsonx", "application/json-seq",
                                   "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                   "application/json; charset=latin-1", "application/json; bad", "*/*",
                                   "application/json, text/plain"])
def test_other_media_types_are_415(value: str | None) -> None:
    exc = refused(check_content_type, value)
    assert (exc.status, exc.reason) == (415, "content_type")


def test_a_declared_length_over_the_limit_is_413() -> None:
    check_declared_length("100", 100)
    check_declared_length(None, 100)
    exc = refused(check_declared_length, "101", 100)
    assert (exc.status, exc.reason, exc.code) == (413, "body_too_large", -31006)


# -- the reporter ---------------------------------------------------------------------------------------------


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(capacity=3, rate=0.5)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.take(1.0)
    assert bucket.take(2.1)
    assert not bucket.take(2.2)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_every_refusal_is_counted_and_records_are_rate_limited_per_reason() -> None:
    counted: list[str] = []
    records: list[dict[str, Any]] = []
    clock = Clock()
    reporter = RefusalReporter(count=counted.append, emit_soon=records.append, burst=2, per_minute=60, clock=clock,
                               wall=lambda: 1_700_000_000.0)
    origin = Refused(403, "Forbidden: Origin not allowed", reason="origin", log_detail="origin=http://evil")
    host = Refused(421, "Misdirected Request", reason="host")
    for _ in range(5):
        reporter.report(origin, "10.0.0.1", "POST", "/mcp")
    reporter.report(host, "10.0.0.2", "GET", "/mcp", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert counted == ["origin"] * 5 + ["host"]
    assert [(r["reason"], r["suppressed"]) for r in records] == [("origin", 0), ("origin", 0), ("host", 0)]
    clock.now = 1.5  # one token back for "origin"
    reporter.report(origin, "10.0.0.1", "POST", "/mcp")
    assert (records[-1]["reason"], records[-1]["suppressed"]) == ("origin", 3)
    assert records[-1]["detail"] == "origin=http://evil"
    assert records[2]["trace"]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    for record in records:
        assert_valid(record)


def test_the_record_is_valid_for_every_reason() -> None:
    for reason in REFUSAL_REASONS:
        doc = http_refused_record(at=1.0, status=400, reason=reason, detail="x" * 10_000, remote_addr=None,
                                  method=None, path=None)
        assert doc["event"] == "http.refused"
        assert len(doc["detail"]) <= 4096
        assert_valid(doc)


# -- remembered Host checks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("listen", [LOOPBACK, PUBLIC, ListenConfig(allowed_hosts=("mcp.example.com",))])
@pytest.mark.parametrize("host", ["localhost:8080", "127.0.0.1", "[::1]:8080", "mcp.example.com", "evil.example",
                                  "127.1", "localhost:1.evil", "", None])
def test_a_remembering_host_check_decides_as_check_host_every_time(listen: ListenConfig, host: str | None) -> None:
    check = HostCheck(listen)

    def verdict(fn: Any, *args: Any) -> tuple[int, str, str] | None:
        try:
            fn(*args)
        except Refused as exc:
            return exc.status, exc.message, exc.reason
        return None

    expected = verdict(check_host, host, listen)
    for _ in range(3):  # first judged, then (if accepted) remembered
        assert verdict(check, host) == expected


def test_a_remembering_host_check_remembers_a_bounded_number_of_values() -> None:
    check = HostCheck(PUBLIC, size=2)
    for i in range(5):
        check(f"h{i}.example.com")
    assert check._accepted == {"h0.example.com", "h1.example.com"}
    assert refused(check, "h..example.com").status == 400  # a refusal is never remembered


# -- header lookups -------------------------------------------------------------------------------------------


def test_front_headers_answer_every_lookup_as_starlettes_headers() -> None:
    from starlette.datastructures import Headers

    from bastion.server.checks import FrontHeaders

    raw = front_headers([(b"Host", b"localhost:8080"), (b"accept", b" application/json "), (b"x-twice", b"one"),
                         (b"X-Twice", b"two"), (b"traceparent", b"00-ab-cd-01"), (b"x-latin", "é".encode("latin-1"))])
    fast, plain = FrontHeaders(list(raw)), Headers(raw=list(raw))
    for key in ("host", "Host", "ACCEPT", "x-twice", "traceparent", "x-latin", "origin", "mcp-session-id"):
        assert fast.get(key) == plain.get(key), key
        assert fast.get(key, "fallback") == plain.get(key, "fallback"), key
        assert (key in fast) == (key in plain)
    assert fast.raw == plain.raw
    assert fast.getlist("x-twice") == ["one", "two"]


@pytest.mark.parametrize(("accept", "expected"), [
    (None, (True, True)),
    ("", (True, True)),
    ("application/json, text/event-stream", (True, True)),
    ("*/*", (True, True)),
    ("application/json", (True, False)),
    ("text/event-stream", (False, True)),
    ("text/*", (False, True)),
    ("application/*;q=0.1", (True, False)),
    ("APPLICATION/JSON ; Q=0.9, Text/Event-Stream", (True, True)),
    # A quality of 0 refuses the type, and the most specific matching range decides.
    ("application/json;q=0, text/event-stream;q=0", (False, False)),
    ("*/*;q=0.5, application/json;q=0", (False, True)),
    ("text/*;q=0, */*", (True, False)),
    ("application/json, */*;q=0", (True, False)),
    # Not the types, only look-alikes; a malformed quality drops its range.
    ("application/jsonx, text/event-streams", (False, False)),
    ("text/html", (False, False)),
    ("application/json;q=abc", (False, False)),
    ("application/json;q=1.5, text/event-stream", (False, True)),
])
def test_accept_is_read_by_quality_and_specificity(accept: str | None, expected: tuple[bool, bool]) -> None:
    assert accepts(accept) == expected


def test_the_endpoints_accept_check_remembers_verdicts_up_to_its_size() -> None:
    check = AcceptCheck(size=2)
    for value in ("application/json, text/event-stream", None, "text/event-stream", "application/json;q=0"):
        assert check(value) == accepts(value)
        assert check(value) == accepts(value)  # remembered or not, the same verdict
    assert len(check._known) == 2


def test_front_headers_list_a_checked_singleton_without_scanning_the_lines() -> None:
    class Unscannable(list[tuple[bytes, bytes]]):
        def __iter__(self) -> Any:
            raise AssertionError("lines scanned")

    lines = front_headers([(b"host", b"localhost"), (b"x-api-key", b"k"), (b"accept", b"a"), (b"accept", b"b")])
    headers = FrontHeaders(lines)
    headers._list = Unscannable(lines)  # what starlette's getlist walks
    assert headers.getlist("x-api-key") == ["k"]
    assert headers.getlist("authorization") == []
    assert FrontHeaders(lines).getlist("accept") == ["a", "b"]  # not a singleton: starlette's own
