"""The front door's JSON: what is refused as unfit (located, not a parse error) and what is not JSON at all."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.strictjson import (
    MAX_CUT_TOKENS,
    MAX_SAFE_INTEGER,
    Document,
    Flaw,
    NotJson,
    TooDeepToRead,
    decode,
    first_flaw,
    printable,
)


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def flaw_of(body: bytes, max_depth: int = 64) -> Flaw | None:
    doc = decode(body, max_depth)
    return doc.flaw(doc.value)


@pytest.mark.parametrize(("body", "path", "problem"), [
    (b'{"a":"\\ud800"}', ("a",), "lone UTF-16 surrogate"),
    (b'{"a":["x","\\udfff y"]}', ("a", 1), "lone UTF-16 surrogate"),
    (b'{"\\udc00":1}', ("\udc00",), "object key with a lone UTF-16 surrogate"),
    (b'{"a":9007199254740992}', ("a",), "JSON-safe range"),
    (b'{"a":-9007199254740992}', ("a",), "JSON-safe range"),
    (b'{"a":18446744073709551616}', ("a",), "JSON-safe range"),  # orjson alone would read a float
    (b'{"a":[1, ' + b"9" * 5000 + b"]}", ("a", 1), "JSON-safe range"),
    (b'{"a":1e400}', ("a",), "too large for a double"),
    (b'{"a":-1e400}', ("a",), "too large for a double"),
])
def test_unfit_values_are_located_not_parse_errors(body: bytes, path: tuple[Any, ...], problem: str) -> None:
    found = flaw_of(body)
    assert found is not None
    assert found.path == path
    assert problem in found.problem


@pytest.mark.parametrize("body", [
    b'{"a":9007199254740991,"b":-9007199254740991}', b'{"a":1.5e300,"b":0.12345678901234567890}',
    b'{"a":"12345678901234567890"}', b'{"a":"\\ud83d\\ude00 paired surrogates are fine"}', b'{"a":1e-400}',
])
def test_fit_values_pass(body: bytes) -> None:
    assert flaw_of(body) is None


def test_depth_counts_the_whole_message_and_names_the_limit() -> None:
    limit = 64
    assert flaw_of(json.dumps(nested(limit - 1, {})).encode(), limit) is None  # {} at the bottom: depth 64
    found = flaw_of(json.dumps(nested(limit, {})).encode(), limit)
    assert found is not None
    assert found.problem == "nesting deeper than 64 levels"
    assert len(found.path) == limit
    assert found.where() == "[0].k[0].k…(58 more)…[0].k"
    assert flaw_of(json.dumps(nested(9, {})).encode(), 8) is not None


def test_past_the_parsers_own_limits_the_envelope_is_still_read() -> None:
    """orjson reads 1024 levels: deeper bodies are cut at the limit so id, method and name can still be read."""
    body = (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t","arguments":{"a":'
            + b"[" * 3000 + b'"]{"' + b"]" * 3000 + b',"b":1}}}')
    doc = decode(body)
    assert doc.cut
    assert (doc.value["id"], doc.value["params"]["name"], doc.value["params"]["arguments"]["b"]) == (5, "t", 1)
    found = doc.flaw(doc.value)
    assert found is not None
    assert found.problem == "nesting deeper than 64 levels"
    assert found.path[:4] == ("params", "arguments", "a", 0)
    assert len(found.path) == 64
    batch = decode(b'[{"id":1,"params":' + b"[" * 2000 + b"]" * 2000 + b"}]")
    item_flaw = batch.flaw(batch.value[0])
    assert item_flaw is not None
    assert len(item_flaw.path) == 64  # counted from the message, not the batch array


def test_a_body_too_deep_and_too_large_to_cut_cannot_be_read() -> None:
    with pytest.raises(TooDeepToRead):
        decode(b'{"id":1,"params":' + b"[" * (MAX_CUT_TOKENS + 10) + b"]" * (MAX_CUT_TOKENS + 10) + b"}")


@pytest.mark.parametrize("body", [
    b"", b"{", b'{"a":}', b"{'a':1}", b'{"a":NaN}', b'{"a":Infinity}', b"\xef\xbb\xbf{}", b'{"a":"\xed\xa0\x80"}',
    b'{"a":"\xff"}', b'{"a":"x\ny"}', b"[1,]", b'"a" "b"',
])
def test_what_is_not_json_is_a_parse_error(body: bytes) -> None:
    with pytest.raises(NotJson):
        decode(body)


def test_printable_replaces_only_lone_surrogates() -> None:
    assert printable("a\ud800b") == "a\ufffdb"
    assert printable("plain ✓") == "plain ✓"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(st.characters(codec=None)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(st.characters(codec=None), max_size=5),
                                                               inner, max_size=4),
    max_leaves=25)


def _expected_problem(value: Any, depth: int, limit: int) -> bool:
    if isinstance(value, dict):
        if depth > limit:
            return True
        return any(printable(k) != k or _expected_problem(v, depth + 1, limit) for k, v in value.items())
    if isinstance(value, list):
        return depth > limit or any(_expected_problem(v, depth + 1, limit) for v in value)
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int):
        return abs(value) > MAX_SAFE_INTEGER
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    return printable(value) != value


@settings(max_examples=300, deadline=None)
@given(value=JSON, limit=st.integers(1, 6))
def test_a_flaw_is_found_exactly_when_there_is_one(value: Any, limit: int) -> None:
    """Against an independent, recursive statement of the rules; the decoder's answer never depends on the
    fast path it took."""
    body = json.dumps({"v": value}).replace("Infinity", "1e400").encode()
    doc = decode(body, limit + 1)
    assert isinstance(doc, Document)
    found = doc.flaw(doc.value)
    assert (found is not None) == _expected_problem({"v": value}, 1, limit + 1), found
    assert (first_flaw(doc.value, limit + 1) is not None) == (found is not None)
