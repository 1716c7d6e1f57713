"""The front door, in-process: arbitrary JSON arguments, one audit record per tools/call, no 5xx, the id echoed.

Arguments are drawn from all of JSON and what JSON can smuggle: deep nesting (past the limit too), wide objects,
unicode with lone surrogates, integers far beyond 64 bits, floats that overflow a double. Both eras.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.inprocess import MODERN_META, FrontDoor, front_door
from tests.support.rpc import parse_body

pytestmark = pytest.mark.asyncio(loop_scope="module")

INF = "\x00inf\x00"  # stands for a number literal no double holds; written as 1e999 on the wire


def nested(depth: int, leaf: Any) -> Any:
    for i in range(depth):
        leaf = [leaf] if i % 2 else {"d": leaf}
    return leaf


TEXT = st.text(st.characters(codec=None), max_size=10)
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**53 - 3, max_value=2**80)
           | st.floats(allow_nan=False, allow_infinity=False) | st.just(INF) | TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5)
                   | st.builds(nested, st.integers(1, 120), inner)),
    max_leaves=30)
ARGUMENTS = st.dictionaries(TEXT, VALUES, max_size=6) | st.builds(
    lambda wide: {f"k{i}": i for i in range(wide)}, st.integers(0, 3000))


def wire(message: dict[str, Any]) -> bytes:
    # ensure_ascii writes lone surrogates as \udXXX escapes, which is how JSON text carries them.
    return json.dumps(message, ensure_ascii=True).replace(json.dumps(INF), "1e999").encode()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def door(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FrontDoor]:
    async with front_door(tmp_path_factory.mktemp("records")) as fd:
        yield fd


IDS = itertools.count(1000)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(arguments=ARGUMENTS, tool=st.sampled_from(["basic__echo", "basic__add", "nope__missing"]),
       era=st.sampled_from(["legacy", "modern"]), string_id=st.booleans())
async def test_one_record_per_call_whatever_the_arguments(door: FrontDoor, arguments: dict[str, Any], tool: str,
                                                         era: str, string_id: bool) -> None:
    n = next(IDS)
    rid: int | str = f"id-{n}" if string_id else n
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    headers: dict[str, str] = {}
    if era == "modern":
        params["_meta"] = MODERN_META
        headers = {"Mcp-Method": "tools/call", "Mcp-Name": tool, "MCP-Protocol-Version": "2026-07-28"}
    else:
        headers = door.legacy if hasattr(door, "legacy") else await _legacy(door)
    before = len(door.records())
    r = await door.post(wire({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}), headers)
    assert r.status_code < 500, r.text
    [answer] = parse_body(r)
    assert answer["id"] == rid
    records = door.records()[before:]
    assert len(records) == 1, records
    assert records[0]["request_id"] == rid
    assert records[0]["era"] == era


async def _legacy(door: FrontDoor) -> dict[str, str]:
    headers = await door.session()
    door.legacy = headers  # type: ignore[attr-defined]
    return headers
