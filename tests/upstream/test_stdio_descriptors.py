"""A stdio server inherits its stdin, stdout and stderr and no other descriptor, on every event loop bastion runs.

uvloop (which ``bastion serve`` runs on) implements no ``close_fds``: a child it spawned inherited every descriptor
the gateway held without ``O_CLOEXEC`` and kept a second copy of each of its own stdio socket ends. These tests
start a real server that lists ``/proc/self/fd`` and run it on the default loop and on uvloop.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.errors import UpstreamTimeout, UpstreamUnavailable
from bastion.upstream.stdio import StdioUpstream
from tests.upstream.helpers import LOOPS, ROOT, Inbox, run_on, server_command

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists descriptors through /proc")

STUCK = "tests.fixtures.stuck_server"

@pytest.fixture
def inheritable_fd(tmp_path: Path) -> Iterator[int]:
    """A descriptor the gateway holds without O_CLOEXEC (as a library or a wrapping process may leave one)."""
    secret = tmp_path / "secret"
    secret.write_text("not for upstreams")
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)
    yield fd
    os.close(fd)


def stuck() -> StdioUpstream:
    return StdioUpstream("stuck", server_command(module=STUCK), cwd=str(ROOT), era="legacy", shutdown_grace=0.5)


async def child_fds(up: StdioUpstream) -> dict[int, str]:
    result = await up.request("tools/call", {"name": "fds", "arguments": {}}, timeout=20)
    text = result["content"][0]["text"]
    return {int(fd): target for fd, target in (line.split(" ", 1) for line in text.splitlines())}


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_child_inherits_only_its_stdio(loop: str, inheritable_fd: int) -> None:
    async def main() -> None:
        up = stuck()
        await up.start(Inbox())
        try:
            fds = await child_fds(up)
        finally:
            await up.close()
        assert sorted(fds) == [0, 1, 2], fds

    run_on(loop, main)


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_child_that_closes_its_stdin_makes_writes_fail(loop: str) -> None:
    """Without a copy of its stdin left in the child, closing fd 0 closes the pipe: bastion's next write fails
    instead of being taken and never answered."""
    async def main() -> None:
        up = stuck()
        await up.start(Inbox())
        try:
            with pytest.raises(UpstreamTimeout):
                await up.request("tools/call", {"name": "deaf", "arguments": {}}, timeout=0.5)
            outcomes: list[str] = []
            for _ in range(20):
                try:
                    await up.request("ping", None, timeout=0.5)
                except UpstreamTimeout:
                    outcomes.append("timeout")
                    continue
                except UpstreamUnavailable as exc:
                    outcomes.append(f"unavailable: {exc.log_detail}")
                break
            assert outcomes and outcomes[-1].startswith("unavailable"), outcomes
        finally:
            await up.close()

    run_on(loop, main)
