"""A forwarded request the limiter let through uncounted says so in its ``request`` record, as a tool call does.

With ``rate_limits.failure_mode: open`` a request whose limits Redis could not count goes through; the audit log
is where an operator learns which ones did (``ratelimit_degraded: true``), whatever the method. Real parts: a
``bastion serve`` whose limiter uses a real redis-server, killed mid-test, and a real stdio upstream; 2026-07-28
requests, which need no session (so nothing but the limiter notices Redis is gone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from bastion.upstream.headers import request_headers
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import ACCEPT, parse_body

V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
REQUESTS = [("prompts/get", {"name": "basic__greet", "arguments": {"language": "french"}}),
            ("resources/read", {"uri": "basic+memo://readme"})]
LIMITER_UNAVAILABLE = -31004


def ask(gw: GatewayProcess, rid: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    params = {**params, "_meta": META}
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    r = httpx.post(gw.url, content=orjson.dumps(body), timeout=30,
                   headers={"Accept": ACCEPT, "Content-Type": "application/json",
                            **request_headers(method, params, V)})
    answer: dict[str, Any] = parse_body(r)[-1]
    return answer


@pytest.mark.parametrize("failure_mode", ["open", "closed"])
def test_a_request_let_through_uncounted_is_marked_in_its_record(tmp_path: Path, private_redis: RedisServer,
                                                                  failure_mode: str) -> None:
    gw = GatewayProcess({
        "auth": "none", "upstreams": {"basic": stdio_upstream()}, "redis": {"url": private_redis.url},
        "rate_limits": {"failure_mode": failure_mode, "timeout": "250ms",
                        "defaults": [{"name": "generous", "rate": "1000/second", "per": "principal"}],
                        "concurrency": [{"name": "inflight", "max": 8, "per": "principal"}]},
    }, tmp_path).start()
    try:
        for method, params in REQUESTS:
            assert "result" in ask(gw, f"before {method}", method, params)
        private_redis.kill()
        for method, params in REQUESTS:
            answer = ask(gw, f"during {method}", method, params)
            if failure_mode == "open":
                assert "result" in answer, answer
            else:
                assert answer["error"]["code"] == LIMITER_UNAVAILABLE, answer
        records = {r["request_id"]: r for r in gw.records("request")}
        assert sorted(records) == sorted(f"{when} {method}" for when in ("before", "during") for method, _ in REQUESTS)
        for method, _ in REQUESTS:
            assert "ratelimit_degraded" not in records[f"before {method}"]
            during = records[f"during {method}"]
            if failure_mode == "open":
                assert (during["outcome"], during.get("ratelimit_degraded")) == ("allowed", True), during
            else:
                assert during["outcome"] == "limiter_unavailable" and "ratelimit_degraded" not in during, during
    finally:
        gw.stop()
