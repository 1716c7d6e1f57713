"""Catalogue limits against upstreams that list far too much, through a running gateway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.audit.helpers import assert_valid
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.rpc import RpcClient


@pytest.fixture(scope="module")
def flooded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("flooded")
    gw = GatewayProcess({
        "auth": "none",
        "upstreams": {
            # 5,000 tools in pages of 100, one 3 MB description, one 400 kB input schema.
            "huge": stdio_upstream("tests.fixtures.huge_catalogue_server", "--tools", "5000", "--page-size", "100",
                                   "--big-description", "3000000", "--big-schema", "400000"),
            # A nextCursor on every page, forever.
            "endless": stdio_upstream("tests.fixtures.huge_catalogue_server", "--tools", "2", "--endless"),
            # The same, with a 3 MB cursor: they count against max_list_size (16 MiB) as they are kept.
            "cursors": stdio_upstream("tests.fixtures.huge_catalogue_server", "--tools", "2", "--endless",
                                      "--cursor-size", "3000000"),
            "basic": stdio_upstream("tests.fixtures.basic_server"),
        },
        "pinning": {"file": str(workdir / "pins.json")},
        "catalogue": {"page_size": 10000, "limits": {"max_pages": 20}},
        "audit": {"sinks": ["stdout"]},
    }, workdir).start(timeout=120)
    yield gw
    gw.stop()


@pytest.fixture
def rpc(flooded: GatewayProcess) -> Iterator[RpcClient]:
    c = RpcClient(flooded.url)
    c.initialize()
    yield c
    c.close()


def limit_records(gw: GatewayProcess) -> dict[tuple[str, str], dict[str, Any]]:
    records = gw.wait_records("catalogue.limit", 5)
    for record in records:
        assert_valid(record)
    return {(r["upstream"], r["limit"]): r for r in records}


def test_excess_is_dropped_and_the_rest_served(rpc: RpcClient, flooded: GatewayProcess) -> None:
    names = rpc.tool_names()
    huge = [n for n in names if n.startswith("huge__")]
    assert len(huge) == 1000  # catalogue.limits.max_tools
    assert "huge__echo" in huge
    assert "huge__big_description" not in names
    assert "huge__big_schema" not in names
    assert "endless__echo" in names
    assert "cursors__echo" in names
    assert rpc.call("basic__echo", {"message": "still here"})["result"]["content"][0]["text"] == "still here"
    assert rpc.call("huge__echo", {"text": "ok"})["result"]["content"][0]["text"] == "ok"


def test_every_drop_is_audited_once_with_the_bound_that_applied(flooded: GatewayProcess) -> None:
    records = limit_records(flooded)
    desc = records[("huge", "max_definition_size")]
    assert (desc["list"], desc["bound"], desc["dropped"], desc["items"]) == ("tools", 512 * 1024, 1,
                                                                             ["big_description"])
    schema = records[("huge", "max_schema_size")]
    assert (schema["bound"], schema["dropped"], schema["items"]) == (256 * 1024, 1, ["big_schema"])
    count = records[("huge", "max_tools")]
    assert count["bound"] == 1000 and count["dropped"] >= 1 and count["items"][0].startswith("t")
    pages = records[("endless", "max_pages")]
    assert (pages["list"], pages["bound"], pages["dropped"], pages["items"]) == ("tools", 20, 0, [])
    # Before: 20 pages fetched, each 3 MB cursor kept, and the listing cut only by max_pages.
    cursors = records[("cursors", "max_list_size")]
    assert (cursors["list"], cursors["bound"], cursors["dropped"], cursors["items"]) == ("tools", 16 << 20, 0, [])
    assert ("cursors", "max_pages") not in records
    # Once per change: refreshes that drop the same items again do not repeat the records.
    assert len(flooded.records("catalogue.limit")) == len(records)
    assert "catalogue.limit" in flooded.stderr()
