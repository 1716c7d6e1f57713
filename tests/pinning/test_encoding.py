"""The fast encodings of pins write exactly the stdlib's bytes: fingerprints are stored and compared across
versions, and the pin file keeps its layout. Generated values cover what takes each path (floats, big integers,
tuples and non-string keys fall back to the stdlib; everything else goes through orjson)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.pinning.encoding import canonical, indented, orjson_exact
from bastion.pinning.fingerprint import fingerprint
from tests.support.catalogue_corpus import upstream_lists

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=8) | st.sampled_from(
    ["\x00\x1f\x7f", '"\\/', "\u2028\u2029", "é", "\U0001f600", "", "a\nb\tc\r"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**65), 2**65), TEXT,
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-05, 1e16, 0.1, -0.0, 1.0]))
VALUES = st.recursive(SCALARS, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(TEXT, children, max_size=4),
    st.tuples(children, children)), max_leaves=20)


def stdlib_canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(VALUES)
def test_both_encodings_match_the_stdlib_byte_for_byte(value: Any) -> None:
    assert canonical(value) == stdlib_canonical(value)
    assert indented(value) == json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def test_every_character_is_escaped_alike() -> None:
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert orjson_exact({text: [text]})
    assert canonical({text: [text]}) == stdlib_canonical({text: [text]})


def test_what_takes_the_stdlib_path() -> None:
    assert orjson_exact({"a": [1, "x", None, True, {"b": 2**64 - 1, "c": -(2**63)}]})
    for value in (1.5, {"a": 1e-05}, [2**64], [-(2**63) - 1], (1, 2), {1: "a"}, {"a": {"b": [float("nan")]}}):
        assert not orjson_exact(value)
        assert canonical(value) == stdlib_canonical(value)


def test_fingerprints_of_a_catalogue_are_unchanged() -> None:
    tools = [t for lists in upstream_lists(4, 25).values() for t in lists.tools]
    for tool in tools:
        view = {k: tool[k] for k in ("name", "title", "description", "inputSchema", "outputSchema", "annotations")}
        assert fingerprint(tool) == "sha256:" + hashlib.sha256(stdlib_canonical(view)).hexdigest()
