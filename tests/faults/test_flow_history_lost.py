"""A flow rule holds through a Redis that loses its data: the session that read private data still cannot send
it out once Redis restarted empty or was flushed; a new session starts clean."""

from __future__ import annotations

from pathlib import Path

import redis

from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.rpc import RpcClient

POLICY = """\
version: 1
labels:
  - {labels: [private_data], tools: [basic__add]}
  - {labels: [external_communication], tools: [basic__echo]}
rules:
  - {id: all, effect: allow}
  - id: no-exfil
    effect: deny
    reveal: true
    labels: [external_communication]
    when: {touched: [private_data]}
"""


def test_a_flushed_redis_does_not_wipe_a_sessions_flow_history(tmp_path: Path, private_redis: RedisServer) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "rules.yaml").write_text(POLICY)
    gw = GatewayProcess({"auth": "none", "redis": {"url": private_redis.url}, "policies": str(tmp_path / "policies"),
                         "upstreams": {"basic": stdio_upstream()}}, tmp_path).start()
    try:
        session = RpcClient(gw.url)
        session.initialize()
        assert "result" in session.call("basic__add", {"a": 1, "b": 2})
        assert session.call("basic__echo", {"message": "secret"})["error"]["code"] == -31007
        redis.Redis.from_url(private_redis.url).flushall()
        # The history read empty, so the same session sent the secret out.
        assert session.call("basic__echo", {"message": "secret"})["error"]["code"] == -31007
        record = [r for r in gw.wait_records("tool.call", 3) if r["tool"]["name"] == "basic__echo"][-1]
        assert record["flow"]["history"] == "unavailable"
        fresh = RpcClient(gw.url)
        fresh.initialize()
        assert "result" in fresh.call("basic__echo", {"message": "hello"})
    finally:
        gw.stop()
