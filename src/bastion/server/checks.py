"""HTTP-level checks that run before bastion reads a body: header shape, Host, Origin, media type, Accept. Pure
functions over headers; a refusal is a ``Refused`` carrying its status and its reason for the operators."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, MutableMapping
from typing import Any, NamedTuple

from starlette.datastructures import Headers

from bastion.auth.credentials import CREDENTIAL_SOURCES
from bastion.errors import HEADER_MISMATCH, INVALID_REQUEST, REQUEST_TOO_LARGE, Refused
from bastion.settings import ListenConfig, is_loopback_host

__all__ = ["FRONT_LINES", "AcceptCheck", "Authority", "FrontHeaders", "FrontLines", "HostCheck", "HostGuard", "accepts",
           "check_content_type", "check_declared_length", "check_host", "check_origin", "front_headers", "front_lines",
           "parse_authority", "parse_origin", "target_authority"]

# Headers every reader must see exactly once: with two copies, the authenticator, the session lookup, the
# version check or a proxy in front could each take a different one ("first one wins" in one place, "last one
# wins" in another). Host: RFC 9112 section 3.2 requires 400 for more than one.
SINGLETON_HEADERS = frozenset({b"host", b"origin", b"content-type", b"content-length", b"mcp-session-id",
                               b"mcp-protocol-version", b"mcp-method", b"mcp-name",
                               *(name.encode("latin-1") for name in CREDENTIAL_SOURCES)})
# The 2026-07-28 routing headers keep the code the revision gives to header defects.
_ROUTING_HEADERS = frozenset({b"mcp-protocol-version", b"mcp-method", b"mcp-name"})
_OWS = b" \t"
# The ASGI scope key under which bastion's HTTP protocol leaves the ``FrontLines`` it gathered.
FRONT_LINES = "bastion.front_lines"

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class Authority(NamedTuple):
    host: str  # lower case; IPv6 without brackets
    port: int | None


class FrontLines:
    """The request's header lines as every later check must see them, gathered one line at a time: values without
    the optional whitespace around them (RFC 9110 section 5.5: a field value never includes it), the first value of
    each name, and the first singleton that came twice.

    bastion's own HTTP protocol (``server/protocol.py``) fills one while it parses the head, so the MCP endpoint
    does not walk the headers again; under another server, ``front_headers`` builds it from the ASGI scope.

    ``target`` is the request target when it is not in origin-form (``/path``): an absolute-form target
    (``http://host/path``), whose authority the Host check judges instead of ``Host`` (RFC 9112 section 3.2.2), or
    the asterisk-form ``*``. Only bastion's protocol sees the raw target; the ASGI scope keeps the path alone.
    """

    __slots__ = ("duplicate", "first", "lines", "target")

    def __init__(self) -> None:
        self.lines: list[tuple[bytes, bytes]] = []
        self.first: dict[bytes, bytes] = {}
        self.duplicate: bytes | None = None
        self.target: bytes | None = None

    def add(self, key: bytes, value: bytes) -> None:
        """One header line; ``key`` in lower case."""
        value = value.strip(_OWS)
        self.lines.append((key, value))
        if key not in self.first:
            self.first[key] = value
        elif self.duplicate is None and key in SINGLETON_HEADERS:
            self.duplicate = key

    def checked(self) -> list[tuple[bytes, bytes]]:
        """The lines; raises ``Refused`` (400) when a singleton header appeared more than once."""
        key = self.duplicate
        if key is not None:
            shown = key.decode("latin-1")
            raise Refused(400, f"Bad Request: {shown} header appears more than once", reason="duplicate_header",
                          code=HEADER_MISMATCH if key in _ROUTING_HEADERS else INVALID_REQUEST,
                          log_detail=f"header={shown}")
        return self.lines

    def replace(self, key: bytes, value: bytes) -> None:
        """Every line named ``key`` (lower case) now carries ``value``."""
        self.lines = [(k, value if k == key else v) for k, v in self.lines]
        if key in self.first:
            self.first[key] = value


def front_lines(raw: Iterable[tuple[bytes, bytes]]) -> FrontLines:
    """``FrontLines`` of an ASGI scope's headers (names in any case)."""
    lines = FrontLines()
    for name, value in raw:
        lines.add(name.lower(), value)
    return lines


def front_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The checked lines of ``front_lines``. Raises ``Refused`` (400) on a duplicate singleton header."""
    return front_lines(raw).checked()


class FrontHeaders(Headers):
    """starlette's ``Headers`` over ``front_headers``' lines, where ``get`` is one dict lookup.

    The front door reads about ten headers per request (Host, Origin, media type, length, Accept, session id,
    version, trace context...); ``Headers.get`` scans the list each time and raises and catches ``KeyError`` for
    every absent one. Same answers: the first line with the name wins, names in any case; everything else is
    ``Headers``' own. ``first`` (each name's first value), when the caller has it, spares building it again.
    """

    def __init__(self, raw: list[tuple[bytes, bytes]], first: dict[bytes, bytes] | None = None) -> None:
        super().__init__(raw=raw)
        if first is None:
            first = {}
            for name, value in raw:
                first.setdefault(name, value)
        # Decoded once, with names in lower case: the callers ask by literal lower-case names.
        self._text = {name.decode("latin-1"): value.decode("latin-1") for name, value in first.items()}

    def getlist(self, key: str) -> list[str]:
        # A header every reader must see once reached here once at most (``FrontLines.checked`` refused a second
        # copy): its list is its value, without scanning the lines (the authenticator asks on every request).
        if key.lower().encode("latin-1") in SINGLETON_HEADERS:
            value = self.get(key)
            return [] if value is None else [value]
        return super().getlist(key)

    def get(self, key: str, default: Any = None) -> Any:
        value = self._text.get(key)
        if value is None and not key.islower():
            value = self._text.get(key.lower())
        return default if value is None else value


def parse_authority(value: str) -> Authority | None:
    """``host[:port]`` as the ``Host`` header and origins carry it, or ``None`` when it is not exactly that.

    The host is a DNS name (letters, digits, ``-``, ``_``; labels of 1-63; at most one trailing dot), a dotted-quad
    IPv4 address, or a bracketed IPv6 address; the port is 1-65535. Nothing else: no user info, no path, no
    percent-encoding, no numeric shorthands (``127.1``, ``0x7f.1``) that some resolvers take for loopback, and a
    port must be digits, so ``localhost:1.attacker.example`` is a host that is not ``localhost``.
    """
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1:]
        try:
            host = ipaddress.IPv6Address(host).compressed
        except ValueError:
            return None
    else:
        host, colon, port_text = value.partition(":")
        rest = colon + port_text
        host = host.lower()
        if not _valid_name(host):
            return None
    if not rest:
        return Authority(host, None)
    if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]):
        return None
    port = int(rest[1:])
    return Authority(host, port) if 0 < port < 65536 else None


def _valid_name(host: str) -> bool:
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > 253:
        return False
    labels = name.split(".")
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(name)  # dotted quad only; leading zeros are refused
        except ValueError:
            return False
        return True
    # A name whose last label is numeric would be read as an IPv4 address by URL parsers (WHATWG): refuse.
    return not labels[-1].isdigit() and all(_LABEL.fullmatch(label) for label in labels)


def parse_origin(origin: str) -> tuple[str, Authority] | None:
    """``scheme://host[:port]`` exactly (what browsers send), as (lower-case scheme, authority); else ``None``."""
    scheme, sep, rest = origin.partition("://")
    scheme = scheme.lower()
    if not sep or not _SCHEME.fullmatch(scheme):
        return None
    authority = parse_authority(rest)
    return None if authority is None else (scheme, authority)


def _origin_key(origin: str) -> str:
    """An origin in one spelling (case, default port), so configured and sent origins compare as origins."""
    parsed = parse_origin(origin)
    if parsed is None:
        return origin
    scheme, (host, port) = parsed
    shown = f"[{host}]" if ":" in host else host
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{shown}"
    return f"{scheme}://{shown}:{port}"


def check_origin(origin: str | None, listen: ListenConfig) -> None:
    """Browsers send ``Origin``; a page on a foreign site must not drive a gateway reachable from the browser.

    Absent ``Origin`` (non-browser clients) is fine. A present one must be configured, or be a well-formed
    http(s) loopback origin while bastion itself listens on loopback.
    """
    if origin is None:
        return
    if "*" in listen.allowed_origins:
        return
    key = _origin_key(origin)
    if any(key == _origin_key(allowed) for allowed in listen.allowed_origins):
        return
    parsed = parse_origin(origin)
    if listen.is_loopback and parsed is not None and parsed[0] in _DEFAULT_PORTS and \
            is_loopback_host(parsed[1].host):
        return
    raise Refused(403, "Forbidden: Origin not allowed", reason="origin", log_detail=f"origin={origin[:200]}")


def check_host(host: str | None, listen: ListenConfig, what: str = "Host header") -> None:
    """``Host`` is required and must be a well-formed authority (RFC 9112 section 3.2: 400 otherwise). A loopback
    listener answers only to loopback names plus configured ones, which defeats DNS rebinding (421).

    ``what`` names the authority's source in the answer: the ``Host`` header, or an absolute-form target."""
    if not host:
        raise Refused(400, f"Bad Request: missing {what}", reason="host", log_detail="host=")
    authority = parse_authority(host)
    if authority is None:
        raise Refused(400, f"Bad Request: invalid {what}", reason="host", log_detail=f"host={host[:200]}")
    if not listen.is_loopback:
        return
    name = authority.host.rstrip(".")
    if is_loopback_host(name) or host in listen.allowed_hosts or name in listen.allowed_hosts:
        return
    raise Refused(421, "Misdirected Request: Host not allowed", reason="host", log_detail=f"host={host[:200]}")


class HostCheck:
    """``check_host`` for one listener, remembering the values it accepted: a client sends the same ``Host`` on
    every request, and judging it (three address parses) was a visible share of the front door's CPU per call.

    ``check_host`` is a pure function of the value and the (fixed) listen settings, so a remembered acceptance is
    exactly what a new check would decide. Refusals are not remembered (they are rare and carry their own
    record), and at most ``size`` values are, so a client sending a new Host each time costs memory for none.
    """

    __slots__ = ("_accepted", "_listen", "_size")

    def __init__(self, listen: ListenConfig, size: int = 64) -> None:
        self._listen = listen
        self._size = size
        self._accepted: set[str] = set()

    def __call__(self, host: str | None, what: str = "Host header") -> None:
        if host in self._accepted:
            return
        check_host(host, self._listen, what)
        if host and len(self._accepted) < self._size:  # (check_host refused an empty or missing one)
            self._accepted.add(host)


def target_authority(target: bytes) -> str | None:
    """The authority of an absolute-form request target (``http://host[:port]/path?query``), as ``Host`` would carry
    it (possibly empty or malformed, for ``check_host`` to judge); ``None`` when the target has no ``http`` or
    ``https`` scheme."""
    text = target.decode("latin-1")
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in _DEFAULT_PORTS:
        return None
    end = len(rest)
    for mark in "/?#":
        at = rest.find(mark, 0, end)
        if at >= 0:
            end = at
    return rest[:end]


class HostGuard:
    """The listener's Host check over an ASGI scope: run once per request, before routing, for every path and
    method (``server/asgi.py``), so no route, 404 or redirect answers a name the listener does not answer to.

    The authority judged is the ``Host`` header's, or, when bastion's protocol saw an absolute-form target, the
    target's: RFC 9112 section 3.2.2 makes the target's authority the one that counts, and the accepted authority
    then replaces ``Host`` in the scope, so what runs after (a redirect's ``Location``, say) sees that one. A
    ``Host`` header is still required, once (400 otherwise). Raises ``Refused`` (400 or 421); a header that every
    reader must see once but came twice is refused first (400), as the MCP endpoint would, so the order of
    checks is the endpoint's own.

    An origin-form request with a ``Host`` accepted before costs two dict lookups and a set lookup: the accepted
    values are remembered as the bytes they arrive as (at most ``size``, as ``HostCheck`` does), so the common case
    decodes nothing and makes no further call.
    """

    __slots__ = ("_accepted", "_check", "_size")

    def __init__(self, listen: ListenConfig, size: int = 64) -> None:
        self._check = HostCheck(listen, size)
        self._accepted: set[bytes] = set()
        self._size = size

    def __call__(self, scope: MutableMapping[str, Any]) -> None:
        lines: FrontLines | None = scope.get(FRONT_LINES)
        if lines is None:  # not bastion's own protocol: gathered here, and kept for the MCP endpoint
            lines = scope[FRONT_LINES] = front_lines(scope["headers"])
        host = lines.first.get(b"host")
        if host in self._accepted and lines.target is None and lines.duplicate is None:
            return
        if lines.duplicate is not None:
            lines.checked()
        target = lines.target
        if target is not None and target != b"*":
            self._absolute(scope, lines, target, host)
            return
        self._check(None if host is None else host.decode("latin-1"))
        if host and len(self._accepted) < self._size:  # (the check refused an empty or missing one)
            self._accepted.add(host)

    def _absolute(self, scope: MutableMapping[str, Any], lines: FrontLines, target: bytes,
                  host: bytes | None) -> None:
        if not host:
            raise Refused(400, "Bad Request: missing Host header", reason="host", log_detail="host=")
        authority = target_authority(target)
        if authority is None:
            shown = target[:200].decode("latin-1")
            raise Refused(400, "Bad Request: invalid request target", reason="host", log_detail=f"target={shown}")
        self._check(authority, "request target authority")
        value = authority.encode("latin-1")
        if value != host:
            lines.replace(b"host", value)
            scope["headers"] = [(k, value if k == b"host" else v) for k, v in scope["headers"]]


def check_content_type(value: str | None) -> None:
    """A POST body must be declared ``application/json`` (any case, parameters allowed; a charset, if given, must
    be UTF-8, the only encoding JSON has). Anything else is 415, before the body is read."""
    if value is None:
        raise Refused(415, "Unsupported Media Type: Content-Type must be application/json", reason="content_type",
                      log_detail="content-type=")
    media, _, params = value.partition(";")
    ok = media.strip(" \t").lower() == "application/json"
    for param in params.split(";") if ok and params else ():
        if not param.strip(" \t"):
            continue
        name, eq, arg = param.partition("=")
        name = name.strip(" \t").lower()
        utf8 = name != "charset" or arg.strip(" \t").strip('"').lower() in ("utf-8", "utf8")
        ok = ok and bool(eq) and bool(_TOKEN.fullmatch(name)) and utf8
    if not ok:
        raise Refused(415, "Unsupported Media Type: Content-Type must be application/json", reason="content_type",
                      log_detail=f"content-type={value[:200]}")


def check_declared_length(value: str | None, limit: int) -> None:
    """A declared ``Content-Length`` over the limit is refused before authentication and before any byte of the
    body is read (the parser has already refused a malformed one)."""
    if value is not None and value.isdigit() and int(value) > limit:
        raise Refused(413, "Request body too large", reason="body_too_large", code=REQUEST_TOO_LARGE,
                      log_detail=f"content-length={value[:20]} limit={limit}")


def accepts(accept: str | None) -> tuple[bool, bool]:
    """(json ok, sse ok) as RFC 9110 section 12.5.1 reads ``Accept``: each type takes the quality of the most
    specific range that matches it (``application/json`` over ``application/*`` over ``*/*``), and a quality of 0
    means "not acceptable". A missing Accept accepts both; a range with a malformed quality is ignored."""
    if not accept:
        return True, True
    json_best = sse_best = (0, 0.0)  # (specificity, quality); specificity 0: no range matched
    for part in accept.split(","):
        media, _, params = part.partition(";")
        media = media.strip(" \t").lower()
        quality = _quality(params) if params else 1.0
        if quality is None:
            continue
        json_rank = _JSON_RANGES.get(media, 0)
        if json_rank and (json_rank, quality) > json_best:
            json_best = (json_rank, quality)
        sse_rank = _SSE_RANGES.get(media, 0)
        if sse_rank and (sse_rank, quality) > sse_best:
            sse_best = (sse_rank, quality)
    return json_best[1] > 0, sse_best[1] > 0


class AcceptCheck:
    """``accepts`` for one endpoint, remembering its verdicts: a client sends the same ``Accept`` on every request,
    and reading it by quality costs five times the old substring test. At most ``size`` values are remembered."""

    __slots__ = ("_known", "_size")

    def __init__(self, size: int = 64) -> None:
        self._known: dict[str | None, tuple[bool, bool]] = {}
        self._size = size

    def __call__(self, accept: str | None) -> tuple[bool, bool]:
        verdict = self._known.get(accept)
        if verdict is None:
            verdict = accepts(accept)
            if len(self._known) < self._size:
                self._known[accept] = verdict
        return verdict


# The ranges that match each type bastion answers with, by specificity.
_JSON_RANGES = {"application/json": 3, "application/*": 2, "*/*": 1}
_SSE_RANGES = {"text/event-stream": 3, "text/*": 2, "*/*": 1}
_QVALUE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)")


def _quality(params: str) -> float | None:
    """The ``q`` of a range's parameters (1 when absent), or None when it is malformed."""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip(" \t").lower() == "q":
            value = value.strip(" \t")
            return float(value) if _QVALUE.fullmatch(value) else None
    return 1.0
