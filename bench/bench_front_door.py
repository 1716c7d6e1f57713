"""Cost of the front door's HTTP protocol limits (server/protocol.py) against uvicorn's plain httptools protocol.

A uvicorn process serves a trivial ASGI app with one protocol or the other; this process drives it over keep-alive
connections with a realistic MCP POST (a dozen headers, a small JSON body) and reports requests per second and the
server's CPU time per request (from /proc, so it is not skewed by the client sharing the machine).

    python bench/bench_front_door.py --seconds 5 --concurrency 8 --rounds 3
    python bench/bench_front_door.py --protocol-only --requests 20000 --rounds 5

``--protocol-only`` leaves the network out: it feeds the same request to a protocol instance over an in-memory
transport, one event loop, and reports the time per request spent in the protocol's ``data_received`` (parse,
callbacks, request cycle), the number to compare on a busy machine. The app task that answers is the same code for
both protocols and runs untimed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from typing import Any

SERVER = r"""
import sys, uvicorn
from bastion.server.protocol import FrontDoorOptions, front_door_protocol

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})

impl, port = sys.argv[1], int(sys.argv[2])
http = front_door_protocol(FrontDoorOptions()) if impl == "front" else "httptools"
uvicorn.run(app, host="127.0.0.1", port=port, http=http, ws="none", lifespan="off", log_config=None,
            access_log=False)
"""

BODY = (b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
        b'"params":{"name":"files__read","arguments":{"path":"/etc/hosts"}}}')
REQUEST = (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\n"
           b"Accept: application/json, text/event-stream\r\nMcp-Session-Id: 3f2a9c1e5b7d4a6f8e0c2b4d6f8a0c2e\r\n"
           b"MCP-Protocol-Version: 2025-11-25\r\nAuthorization: Bearer " + b"x" * 600 + b"\r\n"
           b"User-Agent: bench/1.0\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
           b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def worker(port: int, stop: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n = 0
    while time.monotonic() < stop:
        writer.write(REQUEST)
        await reader.readuntil(b"\r\n\r\n{}")
        n += 1
    counts.append(n)
    writer.close()


async def drive(port: int, seconds: float, concurrency: int) -> int:
    counts: list[int] = []
    stop = time.monotonic() + seconds
    await asyncio.gather(*(worker(port, stop, counts) for _ in range(concurrency)))
    return sum(counts)


def one(impl: str, seconds: float, concurrency: int) -> tuple[float, float]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, impl, str(port)])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        asyncio.run(drive(port, 0.5, concurrency))  # warm-up
        cpu0 = cpu_seconds(proc.pid)
        total = asyncio.run(drive(port, seconds, concurrency))
        cpu = cpu_seconds(proc.pid) - cpu0
        return total / seconds, cpu / total * 1e6
    finally:
        proc.terminate()
        proc.wait()


class _Transport:
    """Enough of an asyncio transport for the protocol: writes are counted, never sent."""

    def __init__(self) -> None:
        self.written = 0
        self.closing = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += 1

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def set_protocol(self, protocol: object) -> None: ...


async def _protocol_only(impl: str, requests: int) -> float:
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from bastion.server.protocol import FrontDoorOptions, front_door_protocol

    async def app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def, type-arg]
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    cls = front_door_protocol(FrontDoorOptions()) if impl == "front" else HttpToolsProtocol
    config = uvicorn.Config(app, http=cls, ws="none", lifespan="off", log_config=None, access_log=False)
    config.load()
    state = ServerState()
    protocol = cls(config=config, server_state=state, app_state={}, _loop=asyncio.get_running_loop())
    transport = _Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    elapsed = 0.0
    for _ in range(requests):
        # Only the protocol's own work is timed (parsing, the callbacks, the request cycle); the app task that
        # answers is the same code for both protocols and runs untimed.
        start = time.perf_counter()
        protocol.data_received(REQUEST)
        elapsed += time.perf_counter() - start
        await asyncio.gather(*state.tasks)
    assert transport.written >= requests, transport.written
    protocol.connection_lost(None)
    return elapsed / requests * 1e6


def _run(coro: Any) -> float:
    """On uvloop, as ``bastion serve`` runs (uvicorn's ``loop="auto"``), when it is installed."""
    try:
        import uvloop
    except ImportError:
        return float(asyncio.run(coro))
    return float(uvloop.run(coro))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--protocol-only", action="store_true")
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    if args.protocol_only:
        timings: dict[str, list[float]] = {"httptools": [], "front": []}
        for _ in range(args.rounds):
            for impl in timings:
                timings[impl].append(_run(_protocol_only(impl, args.requests)))
        for impl, runs in timings.items():
            print(f"{impl:10s} best of {len(runs)}: {min(runs):6.1f} us per request "
                  f"(median {sorted(runs)[len(runs) // 2]:.1f})")
        return
    results: dict[str, list[tuple[float, float]]] = {"httptools": [], "front": []}
    for _ in range(args.rounds):
        for impl in results:  # alternate, so drifting machine load hits both alike
            results[impl].append(one(impl, args.seconds, args.concurrency))
    for impl, runs in results.items():
        rps = sorted(r for r, _ in runs)[len(runs) // 2]
        cpu = sorted(c for _, c in runs)[len(runs) // 2]
        print(f"{impl:10s} median of {len(runs)}: {rps:8.0f} req/s   {cpu:6.1f} us server CPU per request")


if __name__ == "__main__":
    main()
