"""Client capabilities are checked where they are declared (``bastion.protocol.capabilities``), in both eras."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bastion.errors import INVALID_PARAMS, ProtocolError
from bastion.protocol.capabilities import KNOWN_CAPABILITIES, checked_capabilities
from tests.e2e.conftest import stdio_upstream
from tests.support.gateway import GatewayProcess
from tests.support.rpc import ACCEPT

V = "2026-07-28"


@pytest.mark.parametrize("value", [[], "all", None, 5])
def test_capabilities_that_are_not_an_object_are_refused(value: object) -> None:
    with pytest.raises(ProtocolError) as info:
        checked_capabilities(value, "capabilities", http_status=400)
    assert (info.value.code, info.value.http_status) == (INVALID_PARAMS, 400)
    assert "capabilities must be an object" in info.value.message


@pytest.mark.parametrize("name", sorted(KNOWN_CAPABILITIES))
@pytest.mark.parametrize("value", ["yes", [], True, 1, None])
def test_every_known_member_must_be_an_object(name: str, value: object) -> None:
    with pytest.raises(ProtocolError) as info:
        checked_capabilities({name: value}, "capabilities")
    assert f"capabilities.{name} must be an object" in info.value.message


def test_well_formed_capabilities_and_unknown_members_pass_unchanged() -> None:
    caps: dict[str, Any] = {name: {} for name in KNOWN_CAPABILITIES}
    caps["vendor-thing"] = "anything"
    assert checked_capabilities(caps, "capabilities") is caps


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("caps")
    gw = GatewayProcess({"upstreams": {"basic": stdio_upstream()}}, workdir).start()
    yield gw
    gw.stop()


def post(gw: GatewayProcess, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(gw.url, json=body, headers={"Accept": ACCEPT, **(headers or {})}, timeout=10)


@pytest.mark.parametrize("caps", [{"elicitation": "yes"}, {"sampling": []}, {"roots": 5}, []])
def test_an_initialize_declaring_malformed_capabilities_is_refused_with_its_id(
        gw: GatewayProcess, caps: object) -> None:
    response = post(gw, {"jsonrpc": "2.0", "id": 41, "method": "initialize",
                         "params": {"protocolVersion": "2025-11-25", "capabilities": caps,
                                    "clientInfo": {"name": "t", "version": "1"}}})
    body = response.json()
    assert body["id"] == 41
    assert body["error"]["code"] == INVALID_PARAMS
    assert "mcp-session-id" not in response.headers


def test_an_initialize_without_capabilities_still_opens_a_session(gw: GatewayProcess) -> None:
    response = post(gw, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"protocolVersion": "2025-11-25", "clientInfo": {"name": "t", "version": "1"}}})
    assert response.status_code == 200
    assert "mcp-session-id" in response.headers


def test_a_modern_request_declaring_malformed_capabilities_is_refused(gw: GatewayProcess) -> None:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/list",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": V,
                                 "io.modelcontextprotocol/clientCapabilities": {"elicitation": "yes"}}}}
    response = post(gw, body, {"MCP-Protocol-Version": V, "Mcp-Method": "tools/list"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == INVALID_PARAMS
    assert "elicitation must be an object" in error["message"]
    assert response.json()["id"] == 7
