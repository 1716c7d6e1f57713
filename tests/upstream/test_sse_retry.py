"""An SSE ``retry:`` field is the upstream's digits: however many there are, the stream that carries it goes on.

5,000 digits made the decoder raise (``int`` parses at most 4,300): on the legacy HTTP+SSE transport that ended
the task reading the one stream every answer comes on, unnoticed, so the upstream stayed "connected" while every
request timed out, for good. 400 digits (no float holds the delay) ended the Streamable HTTP GET stream's task the
same way, and with it the upstream's change notifications. A delay is now at most ``MAX_RETRY_MS``, and a GET
stream is reopened after at most the backoff's maximum whatever the server asks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bastion.upstream.http import HttpUpstream
from bastion.upstream.http_sse import SseUpstream
from tests.upstream.helpers import HttpServer, Inbox

FIXTURE = "tests.fixtures.sse_retry_server"


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[HttpServer]:
    running = HttpServer("sse", tmp_path / "unused", extra=("--retry-digits", str(request.param)),
                         module=FIXTURE).start()
    yield running
    running.stop()


async def call(up: SseUpstream, tool: str) -> str:
    result = await up.request("tools/call", {"name": tool, "arguments": {}}, timeout=10)
    return str(result["content"][0]["text"])


@pytest.mark.parametrize("server", [5000, 400], indirect=True)
async def test_a_huge_retry_field_leaves_the_legacy_sse_stream_serving(server: HttpServer) -> None:
    async with httpx.AsyncClient() as client:
        up = SseUpstream("games", server.base + "/sse", {}, client)
        await up.start(Inbox())
        try:
            assert await call(up, "retry") == "retry"  # the answer after the field, on the same stream
            assert await call(up, "echo") == "echo"
        finally:
            await up.close()


@pytest.mark.parametrize("server", [5000, 400], indirect=True)
async def test_a_huge_retry_field_on_the_get_stream_delays_it_at_most_the_backoff_maximum(server: HttpServer) -> None:
    inbox = Inbox()
    async with httpx.AsyncClient() as client:
        # The first GET stream sends the field and ends; the next one announces a change.
        up = HttpUpstream("games", server.base + "/mcp", {}, client, backoff_max=0.5)
        await up.start(inbox)
        try:
            await inbox.wait_for("notifications/tools/list_changed")
        finally:
            await up.close()
