from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fixture_server import FixtureServer
from tests.support.gateway import REPO, GatewayProcess

# Our fixture servers are built on the SDK's low-level Server, whose handlers answer in the handshake era's
# shapes; they are pinned to the legacy era so era detection cannot misjudge them. Modern upstreams are tested
# with fixtures written for that era.
LEGACY = {"era": "legacy"}


def stdio_upstream(module: str = "tests.fixtures.basic_server", *args: str, **extra: Any) -> dict[str, Any]:
    return {"command": [sys.executable, "-m", module, "--transport", "stdio", *args], "cwd": str(REPO),
            **LEGACY, **extra}


@pytest.fixture(scope="module")
def http_fixture() -> Iterator[FixtureServer]:
    server = FixtureServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, http_fixture: FixtureServer) -> Iterator[GatewayProcess]:
    """bastion in front of the fixture server twice: over stdio (prefix basic) and over HTTP (prefix web)."""
    workdir: Path = tmp_path_factory.mktemp("gw")
    record = workdir / "basic-calls.jsonl"
    gw = GatewayProcess({
        "auth": "none",
        "upstreams": {
            "basic": stdio_upstream("tests.fixtures.basic_server", "--record", str(record)),
            "web": {"url": http_fixture.url, **LEGACY},
        },
    }, workdir).start()
    gw.record_file = record  # type: ignore[attr-defined]
    yield gw
    gw.stop()
