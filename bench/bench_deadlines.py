"""How late does a caller hear of a frozen upstream? One real upstream per transport, frozen with SIGSTOP behind a
running gateway; the caller's latency to its -31003 error is measured against the configured timeout.

    python bench/bench_deadlines.py [--timeout 2] [--calls 5]

Prints one Markdown table: per transport, the configured timeout and the caller's min / median / max latency
(the excess over the timeout is the gateway's error window), and how long after SIGCONT the upstream answered a
call again. Everything it starts is stopped (and resumed) before it exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.conftest import LEGACY, stdio_upstream
from tests.support.fixture_server import FixtureServer
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient


def stdio_pid(gw: GatewayProcess) -> int:
    assert gw.proc is not None
    children = Path(f"/proc/{gw.proc.pid}/task/{gw.proc.pid}/children").read_text().split()
    return min(int(p) for p in children)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    servers = {"http": FixtureServer("tests.fixtures.basic_server"),
               "sse": FixtureServer("tests.fixtures.basic_server", "--transport", "sse"),
               "modern": FixtureServer("tests.fixtures.modern_server")}
    limit = {"timeout": f"{args.timeout:g}s"}
    with tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess({"auth": "none", "upstreams": {
            "stdio": stdio_upstream(**limit),
            "http": {"url": servers["http"].url, **LEGACY, **limit},
            "sse": {"url": servers["sse"].url.replace("/mcp", "/sse"), "transport": "sse", **limit},
            "modern": {"url": servers["modern"].url, "era": "modern", **limit},
        }}, Path(tmp)).start()
        try:
            client = RpcClient(gw.url)
            client.initialize()
            print("| transport | timeout | caller latency min / median / max (s) | answers again after SIGCONT (s) |")
            print("|---|---|---|---|")
            for name in ("stdio", "http", "modern", "sse"):
                pid = stdio_pid(gw) if name == "stdio" else servers[name].proc.pid
                os.kill(pid, signal.SIGSTOP)
                latencies = []
                try:
                    for _ in range(args.calls):
                        started = time.monotonic()
                        answer = client.call(f"{name}__echo", {"message": "x"})
                        latencies.append(time.monotonic() - started)
                        assert answer.get("error", {}).get("code") == -31003, answer
                finally:
                    os.kill(pid, signal.SIGCONT)
                resumed = time.monotonic()
                while "result" not in client.call(f"{name}__echo", {"message": "x"}):
                    time.sleep(0.05)
                recovery = time.monotonic() - resumed
                print(f"| {name} | {args.timeout:g} s | {min(latencies):.3f} / {statistics.median(latencies):.3f} / "
                      f"{max(latencies):.3f} | {recovery:.3f} |")
        finally:
            gw.stop()
            for server in servers.values():
                server.stop()


if __name__ == "__main__":
    main()
