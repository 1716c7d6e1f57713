"""The httpx client every HTTP upstream shares (``httpio.upstream_client``) carries nothing from one answer to the
next request: no cookie is kept, no redirect followed. Against two real servers on one host, other ports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bastion.upstream.httpio import upstream_client
from tests.support.raw_http import read_request


class Recorder:
    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.cookies: list[str | None] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/mcp"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                _, _, headers, _ = await read_request(reader)
                self.cookies.append(headers.get("cookie"))
                writer.write(self.answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Recorder, Recorder]]:
    setter = Recorder(b"HTTP/1.1 302 Found\r\nSet-Cookie: upstream_session=SECRET; Path=/\r\n"
                      b"Set-Cookie: other=1; Domain=127.0.0.1; Path=/\r\nLocation: /elsewhere\r\n"
                      b"Content-Length: 0\r\n\r\n")
    other = Recorder(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    for r in (setter, other):
        r.server = await asyncio.start_server(r.serve, "127.0.0.1", 0)
    yield setter, other
    for r in (setter, other):
        assert r.server is not None
        r.server.close()


async def test_no_cookie_is_kept_and_no_redirect_followed(pair: tuple[Recorder, Recorder]) -> None:
    setter, other = pair
    async with upstream_client() as http:
        first = await http.get(setter.url)
        assert first.status_code == 302  # not followed
        assert first.headers.get_list("set-cookie")  # it was set...
        assert len(http.cookies.jar) == 0  # ...and not kept
        http.cookies.set("planted", "x", domain="127.0.0.1")  # even one put there by hand is never sent
        await http.get(other.url)
        await http.get(setter.url)
    assert setter.cookies == [None, None]
    assert other.cookies == [None]
