"""A ``format`` checker whose every check is cheap: fixed linear regexes and stdlib parsers, nothing that can
backtrack, resolve names or load optional packages.

Unknown formats pass, as the specification requires.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import uuid
from typing import Any

from jsonschema import FormatChecker

from bastion.validation.regex import UnsupportedPattern, compile_pattern

# All of these are linear: no nested quantifiers, no ambiguous alternations.
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII)
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s]*")
_NO_SPACE = re.compile(r"[^\s]*")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)
_BAD_POINTER_ESCAPE = re.compile(r"~(?![01])")
_MAX_HOSTNAME = 253


def _is_date(value: str) -> bool:
    if not _DATE.fullmatch(value):
        return False
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _is_time(value: str) -> bool:
    match = _TIME.fullmatch(value)
    if not match:
        return False
    hour, minute, second = (int(match.group(i)) for i in (1, 2, 3))
    # 60 admits a leap second, as RFC 3339 does.
    return hour <= 23 and minute <= 59 and second <= 60


def _is_date_time(value: str) -> bool:
    date, sep, time = value[:10], value[10:11], value[11:]
    return sep in ("T", "t") and _is_date(date) and _is_time(time)


def _is_ipv4(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def _is_ipv6(value: str) -> bool:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return True


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return len(value) == 36 and all(value[i] == "-" for i in (8, 13, 18, 23))


def _is_hostname(value: str) -> bool:
    if not value or len(value) > _MAX_HOSTNAME:
        return False
    return all(_LABEL.fullmatch(label) for label in value.rstrip(".").split("."))


def _is_regex(value: str) -> bool:
    try:
        compile_pattern(value)
    except UnsupportedPattern:
        return False
    return True


def _is_json_pointer(value: str) -> bool:
    return value == "" or (value.startswith("/") and _BAD_POINTER_ESCAPE.search(value) is None)


_CHECKS = {
    "date": _is_date,
    "time": _is_time,
    "date-time": _is_date_time,
    "email": lambda value: "@" in value,
    "idn-email": lambda value: "@" in value,
    "ipv4": _is_ipv4,
    "ipv6": _is_ipv6,
    "uuid": _is_uuid,
    "hostname": _is_hostname,
    "uri": lambda value: _URI.fullmatch(value) is not None,
    "uri-reference": lambda value: _NO_SPACE.fullmatch(value) is not None,
    "iri": lambda value: _URI.fullmatch(value) is not None,
    "iri-reference": lambda value: _NO_SPACE.fullmatch(value) is not None,
    "regex": _is_regex,
    "json-pointer": _is_json_pointer,
}

SUPPORTED_FORMATS = frozenset(_CHECKS)


def build_format_checker() -> FormatChecker:
    checker = FormatChecker(formats=())
    for name, check in _CHECKS.items():
        checker.checks(name)(_only_strings(check))
    return checker


def _only_strings(check: Any) -> Any:
    def run(instance: object) -> bool:
        # Formats constrain strings only; other types are left to ``type``.
        return not isinstance(instance, str) or bool(check(instance))

    return run
