"""Latency of the admin console's pages over its real listener (a gateway process with the stdio fixture).

    python -m bench.bench_console [--requests 300]

Prints p50/p99 per page. The numbers include the HTTP round trip on loopback and Jinja2 rendering.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from tests.support.gateway import REPO, GatewayProcess
from tests.support.net import free_port

from bastion.auth.apikeys import hash_key

KEY = "bst_bench_admin_key_0123456789abcdef"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bastion-console-bench-"))
    port = free_port()
    gw = GatewayProcess({
        "auth": {"api_keys": [{"id": "root", "hash": hash_key(KEY), "groups": ["admin"]}]},
        "upstreams": {"basic": {"command": [sys.executable, "-m", "tests.fixtures.basic_server", "--transport",
                                            "stdio"], "cwd": str(REPO), "era": "legacy"}},
        "admin": {"port": port},
    }, workdir).start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            form = client.get("/login").text
            token = re.search(r'name="csrf" value="([^"]+)"', form)
            assert token is not None
            client.post("/login", data={"csrf": token.group(1), "key": KEY})
            for page in ("/", "/partials/upstreams", "/catalogue", "/pins", "/policy"):
                times = []
                for _ in range(args.requests):
                    start = time.perf_counter()
                    r = client.get(page)
                    times.append((time.perf_counter() - start) * 1000)
                    assert r.status_code == 200, (page, r.status_code)
                times.sort()
                print(f"{page:22} p50 {statistics.median(times):6.2f} ms   "
                      f"p99 {times[int(len(times) * 0.99) - 1]:6.2f} ms")
    finally:
        gw.stop()


if __name__ == "__main__":
    main()
