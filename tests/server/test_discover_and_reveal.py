"""What the wire says matches the docs: server/discover's cache hints follow the policy (docs/protocol.md), and a
denied call answers "Unknown tool" unless the policy reveals it (docs/policy.md). In-process, real upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.inprocess import MODERN_META, FrontDoor, front_door
from tests.support.rpc import parse_body

POLICY = """
version: 1
rules:
  - id: everyone
    effect: allow
  - id: no-add
    effect: deny
    description: "Arithmetic is done by the calculator team's gateway"
    tools: [basic__add]
    {reveal}
"""


async def modern(door: FrontDoor, rid: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    headers = {"Mcp-Method": method, "MCP-Protocol-Version": "2026-07-28"}
    if params and "name" in params:
        headers["Mcp-Name"] = params["name"]
    r = await door.post({"jsonrpc": "2.0", "id": rid, "method": method,
                         "params": {**(params or {}), "_meta": MODERN_META}}, headers)
    [answer] = parse_body(r)
    return answer


async def test_discover_is_public_without_a_policy_and_private_with_one(tmp_path: Path) -> None:
    async with front_door(tmp_path) as door:
        result = (await modern(door, 1, "server/discover"))["result"]
        assert (result["cacheScope"], result["ttlMs"]) == ("public", 60_000)
        listed = (await modern(door, 2, "tools/list"))["result"]
        assert (listed["cacheScope"], listed["ttlMs"]) == ("public", 30_000)
    policy = tmp_path / "policies"
    policy.mkdir()
    (policy / "p.yaml").write_text(POLICY.format(reveal=""))
    async with front_door(tmp_path, policies=[str(policy)]) as door:
        for rid, method in ((3, "server/discover"), (4, "tools/list")):
            result = (await modern(door, rid, method))["result"]
            assert (result["cacheScope"], result["ttlMs"]) == ("private", 0), method


async def test_a_denied_call_is_unknown_unless_the_policy_reveals_it(tmp_path: Path) -> None:
    for reveal, expected in (("", {"code": -32602, "message": "Unknown tool: basic__add"}),
                             ("reveal: true", {"code": -31007, "message": (
                                 "Call to basic__add denied by policy: rule 'no-add': Arithmetic is done by the "
                                 "calculator team's gateway"), "data": {
                                 "tool": "basic__add", "rule": "no-add",
                                 "description": "Arithmetic is done by the calculator team's gateway"}})):
        workdir = tmp_path / (reveal.replace(": ", "-") or "default")
        (workdir / "policies").mkdir(parents=True)
        (workdir / "policies" / "p.yaml").write_text(POLICY.format(reveal=reveal))
        async with front_door(workdir, policies=[str(workdir / "policies")]) as door:
            answer = await modern(door, 7, "tools/call", {"name": "basic__add", "arguments": {"a": 1, "b": 2}})
            assert answer["error"] == expected
            [record] = door.records()
            assert (record["request_id"], record["outcome"], record["rule_id"]) == (7, "denied", "no-add")
            assert record["error"]["code"] == expected["code"]
            echo = await modern(door, 8, "tools/call", {"name": "basic__echo", "arguments": {"message": "hi"}})
            assert echo["result"]["content"][0]["text"] == "hi"
