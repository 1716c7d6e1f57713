"""A floor for the gateway's cost per call: uvicorn (httptools, uvloop) and bastion's upstream pool forwarding each
POST body to one upstream and its answer back, with nothing else (no checks, parsing, sessions, guards or audit).

    python bench/floor_asgi.py --port 18182 --upstream http://127.0.0.1:18191/mcp

``instructions.py --scenario floor`` counts it beside bastion's configurations: what any Python MCP proxy on this
stack pays before doing anything of its own. It forwards ``Mcp-Session-Id`` and ``MCP-Protocol-Version`` both
ways, so the load generator's sessions work through it.
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn

from bastion.upstream.connections import H1Pool, Target


def app_for(upstream: str) -> Any:
    pool = H1Pool("floor")
    target = Target.from_url(upstream)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        for name, value in scope["headers"]:
            if name == b"mcp-session-id":
                headers["Mcp-Session-Id"] = value.decode("latin-1")
            elif name == b"mcp-protocol-version":
                headers["MCP-Protocol-Version"] = value.decode("latin-1")
        async with pool.post(target, headers, body) as response:
            data = await response.aread()
            out = [(b"content-type", response.headers.get("content-type", "application/json").encode("latin-1")),
                   (b"content-length", b"%d" % len(data))]
            session = response.headers.get("mcp-session-id")
            if session:
                out.append((b"mcp-session-id", session.encode("latin-1")))
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            await send({"type": "http.response.body", "body": data})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's MCP URL")
    args = parser.parse_args()
    uvicorn.run(app_for(args.upstream), host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                http="httptools", loop="uvloop", lifespan="off")


if __name__ == "__main__":
    main()
