"""FastMCP's proxy in front of one Streamable HTTP upstream, sharing one upstream session among all its clients.

    bench/.cache/fastmcp/bin/python bench/fastmcp_proxy.py --upstream http://127.0.0.1:8092/mcp --port 8093

Runs in the virtualenv that ``bench/sidebyside.py`` makes for the pinned FastMCP version (FastMCP is not a
dependency of bastion). A *connected* ``fastmcp.Client`` handed to ``create_proxy`` is reused for every request,
which is FastMCP's cheapest proxy mode: without it, the proxy opens a fresh upstream session (``initialize``
and all) per client request and would be measured at its worst. No auth, no middleware: the peer with no guards.
Answers are JSON (``json_response=True``), as bastion's are, so both are measured on the same wire format.
"""

from __future__ import annotations

import argparse
import asyncio

from fastmcp import Client
from fastmcp.server import create_proxy


async def serve(upstream: str, host: str, port: int) -> None:
    async with Client(upstream) as client:
        proxy = create_proxy(client, name="fastmcp-proxy")
        await proxy.run_http_async(show_banner=False, host=host, port=port, log_level="warning", path="/mcp",
                                   json_response=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="the upstream's MCP URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.upstream, args.host, args.port))


if __name__ == "__main__":
    main()
