"""Every method the front door serves either stays in bastion or is forwarded, and every forwarded one passes the
limiter: one limit per method (``methods``), a budget of one each, so the second request of each is refused by its
own limit and by no other's. The real app in this process, the fixture upstream as a real subprocess, both eras.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from bastion.protocol import methods as m
from bastion.upstream.headers import request_headers
from tests.support.inprocess import MODERN_META, FrontDoor, front_door

pytestmark = pytest.mark.asyncio(loop_scope="module")

REQUESTS: dict[str, dict[str, Any]] = {
    m.TOOLS_CALL: {"name": "basic__echo", "arguments": {"message": "hi"}},
    m.PROMPTS_GET: {"name": "basic__greet", "arguments": {"language": "french"}},
    m.RESOURCES_READ: {"uri": "basic+memo://notes/1"},
    m.RESOURCES_SUBSCRIBE: {"uri": "basic+memo://readme"},
    m.RESOURCES_UNSUBSCRIBE: {"uri": "basic+memo://readme"},
    m.COMPLETE: {"ref": {"type": "ref/resource", "uri": "basic+memo://notes/{id}"},
                 "argument": {"name": "id", "value": "1"}},
}


def limit_name(method: str) -> str:
    return "only-" + method.replace("/", "-")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def door(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FrontDoor]:
    limits = [{"name": limit_name(method), "rate": "1/hour", "per": "principal_tool", "methods": [method]}
              for method in m.FORWARDED]
    async with front_door(tmp_path_factory.mktemp("forwarded"), rate_limits={"defaults": limits}) as fd:
        yield fd


async def test_every_method_served_is_either_forwarded_or_answered_by_bastion(door: FrontDoor) -> None:
    served = door.app.state.bastion.endpoint.dispatcher.methods | {m.INITIALIZE, m.LISTEN}
    assert not set(m.FORWARDED) & m.LOCAL
    assert served == set(m.FORWARDED) | m.LOCAL
    assert set(REQUESTS) == set(m.FORWARDED)


async def rpc(door: FrontDoor, headers: dict[str, str], rid: int, method: str,
              params: dict[str, Any]) -> dict[str, Any]:
    r = await door.post({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}, headers)
    lines = [line[5:] for line in r.text.splitlines() if line.startswith("data:")]
    answer: dict[str, Any] = json.loads(lines[-1]) if lines else r.json()
    return answer


@pytest.mark.parametrize("method", m.FORWARDED)
async def test_each_forwarded_method_is_held_to_its_own_limit(door: FrontDoor, method: str) -> None:
    headers = await door.session()
    first = await rpc(door, headers, 1, method, REQUESTS[method])
    assert "result" in first, first
    second = await rpc(door, headers, 2, method, REQUESTS[method])
    assert second["error"]["code"] == -31001, second
    assert second["error"]["data"]["limit"] == limit_name(method)
    event = "tool.call" if method == m.TOOLS_CALL else "request"
    refused = [r for r in door.records(event) if r.get("limit") == limit_name(method)]
    assert len(refused) == 1 and refused[0]["outcome"] == "rate_limited" and refused[0]["request_id"] == 2
    if method != m.TOOLS_CALL:
        assert refused[0]["method"] == method and refused[0]["era"] == "legacy"


async def test_requests_bastion_answers_itself_count_against_no_limit(door: FrontDoor) -> None:
    headers = await door.session()
    for rid, method in enumerate([m.TOOLS_LIST, m.PROMPTS_LIST, m.RESOURCES_LIST, m.RESOURCE_TEMPLATES_LIST,
                                  m.PING] * 3):
        assert "result" in await rpc(door, headers, rid, method, {}), method


async def test_a_modern_prompts_get_is_held_to_the_same_limit(door: FrontDoor) -> None:
    params = {"name": "basic__greet", "arguments": {"language": "english"}, "_meta": MODERN_META}
    headers = request_headers(m.PROMPTS_GET, params, "2026-07-28", None)
    # The legacy test above spent this principal's budget for the prompt (principal_tool: the prompt's own).
    answers = [await rpc(door, headers, rid, m.PROMPTS_GET, params) for rid in (10, 11)]
    assert answers[-1]["error"]["code"] == -31001, answers
    assert answers[-1]["error"]["data"]["limit"] == limit_name(m.PROMPTS_GET)
    assert [r["era"] for r in door.records("request") if r["request_id"] == 11] == ["modern"]
