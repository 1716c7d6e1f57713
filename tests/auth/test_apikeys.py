from __future__ import annotations

import hmac
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.datastructures import Headers

from bastion.auth import AuthConfig, Authenticator, build_authenticator, generate_key, hash_key, strip_credentials
from bastion.auth.apikeys import ApiKeyTable
from bastion.errors import AuthenticationError
from bastion.principal import Principal
from bastion.server.checks import FrontHeaders

ALICE_KEY, ALICE = generate_key("alice", ["eng"], {"team": "search"})
BOB_KEY, BOB = generate_key("bob")


def test_generated_keys_are_random_and_hashed() -> None:
    assert re.fullmatch(r"bst_[A-Za-z0-9_-]{43}", ALICE_KEY)
    assert ALICE_KEY != BOB_KEY
    assert ALICE.hash == hash_key(ALICE_KEY)
    assert ALICE.hash.startswith("sha256:")
    assert ALICE_KEY not in repr(ALICE)
    assert ALICE.to_mapping() == {"id": "alice", "hash": ALICE.hash, "groups": ["eng"],
                                  "attributes": {"team": "search"}}


def test_hash_is_plain_sha256() -> None:
    assert hash_key("abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_lookup_compares_every_entry_in_constant_time() -> None:
    calls: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return hmac.compare_digest(a, b)

    entries = [ALICE, BOB, *(generate_key(f"k{i}")[1] for i in range(5))]
    table = ApiKeyTable(entries, compare=spy)
    assert table.lookup(ALICE_KEY) == ALICE  # the first entry matches ...
    assert len(calls) == len(entries)  # ... and every other entry is still compared
    calls.clear()
    assert table.lookup("bst_wrong") is None
    assert len(calls) == len(entries)
    assert all(len(a) == 32 for a, _ in calls)  # digests, never the presented key itself


def test_a_key_stands_for_one_principal_made_once() -> None:
    table = ApiKeyTable([ALICE, BOB])
    alice = table.principal(ALICE_KEY)
    assert alice == Principal(id="alice", groups=frozenset({"eng"}), attributes=ALICE.attributes,
                              auth_method="api_key")
    assert table.principal(ALICE_KEY) is alice
    assert table.principal(BOB_KEY) is not None and table.principal(BOB_KEY) != alice
    assert table.principal("bst_wrong") is None


async def test_starlette_headers_are_read_case_insensitively(authenticator: Authenticator) -> None:
    for name in (b"authorization", b"x-api-key"):
        value = (b"Bearer " if name == b"authorization" else b"") + ALICE_KEY.encode()
        headers = Headers(raw=[(b"accept", b"application/json"), (name, value)])
        assert (await authenticator.authenticate(headers)).id == "alice"
    with pytest.raises(AuthenticationError):
        await authenticator.authenticate(Headers(raw=[(b"accept", b"application/json")]))


async def test_the_front_doors_headers_are_not_scanned_again_for_an_absent_credential_header(
        authenticator: Authenticator) -> None:
    """``FrontHeaders`` (what the MCP endpoint passes) answers by name like starlette's ``Headers``: looking for
    the absent one of ``Authorization`` and ``X-API-Key`` must not walk and decode every header again."""

    class Unscannable(FrontHeaders):
        def items(self) -> Any:
            raise AssertionError("headers scanned again")

    for name in (b"authorization", b"x-api-key"):
        value = (b"Bearer " if name == b"authorization" else b"") + ALICE_KEY.encode()
        headers = Unscannable([(b"accept", b"application/json"), (name, value)])
        assert (await authenticator.authenticate(headers)).id == "alice"


@pytest.mark.parametrize("first", [ALICE_KEY, BOB_KEY], ids=["alice-first", "bob-first"])
async def test_a_credential_header_presented_twice_is_refused_whichever_comes_first(
        authenticator: Authenticator, first: str) -> None:
    """Off the front door (the admin API and console pass starlette's headers), two copies of a credential header
    must not let the first one decide who the caller is."""
    second = BOB_KEY if first == ALICE_KEY else ALICE_KEY
    for name, prefix in ((b"x-api-key", b""), (b"authorization", b"Bearer ")):
        headers = Headers(raw=[(name, prefix + first.encode()), (name, prefix + second.encode())])
        with pytest.raises(AuthenticationError) as info:
            await authenticator.authenticate(headers)
        assert info.value.status == 401
        assert info.value.headers["WWW-Authenticate"] == 'Bearer realm="bastion", error="invalid_request"'
        assert "more than once" in (info.value.log_detail or "")


@pytest.fixture
async def authenticator() -> AsyncIterator[Authenticator]:
    cfg = AuthConfig.from_mapping({"api_keys": [ALICE.to_mapping(), BOB.to_mapping()]}, listen_host="0.0.0.0")
    async with httpx.AsyncClient() as http:
        yield build_authenticator(cfg, http)


async def test_bearer_and_x_api_key_forms(authenticator: Authenticator) -> None:
    for headers in ({"Authorization": f"Bearer {ALICE_KEY}"}, {"authorization": f"bearer  {ALICE_KEY} "},
                    {"X-API-Key": ALICE_KEY}, {"x-api-key": ALICE_KEY}):
        principal = await authenticator.authenticate(headers)
        assert principal == Principal(id="alice", groups=frozenset({"eng"}), attributes=ALICE.attributes,
                                      auth_method="api_key")
    bob = await authenticator.authenticate({"X-API-Key": BOB_KEY})
    assert (bob.id, bob.groups, bob.auth_method) == ("bob", frozenset(), "api_key")


async def test_missing_credentials(authenticator: Authenticator) -> None:
    with pytest.raises(AuthenticationError) as info:
        await authenticator.authenticate({"Accept": "application/json"})
    err = info.value
    assert err.status == 401
    # No error code when nothing was presented (RFC 6750 §3.1); no resource_metadata without JWT.
    assert err.headers == {"WWW-Authenticate": 'Bearer realm="bastion"'}


@pytest.mark.parametrize(("headers", "error"), [
    ({"Authorization": "Bearer bst_wrong"}, "invalid_token"),
    ({"X-API-Key": "bst_wrong"}, "invalid_token"),
    ({"Authorization": f"Basic {ALICE_KEY}"}, "invalid_request"),
    ({"Authorization": "Bearer "}, "invalid_request"),
    ({"Authorization": f"Bearer {ALICE_KEY}", "X-API-Key": ALICE_KEY}, "invalid_request"),
    ({"X-API-Key": "x" * 20000}, "invalid_request"),
])
async def test_bad_credentials(authenticator: Authenticator, headers: dict[str, str], error: str) -> None:
    with pytest.raises(AuthenticationError) as info:
        await authenticator.authenticate(headers)
    err = info.value
    assert err.status == 401
    assert err.headers["WWW-Authenticate"] == f'Bearer realm="bastion", error="{error}"'
    assert err.message in ("Invalid credentials", "Authentication required")
    assert err.log_detail
    assert ALICE_KEY not in err.log_detail
    assert "bst_wrong" not in err.log_detail


async def test_none_mode_is_anonymous() -> None:
    async with httpx.AsyncClient() as http:
        auth = build_authenticator(AuthConfig.from_mapping("none", listen_host="0.0.0.0"), http)
        assert await auth.authenticate({}) == Principal.anonymous()
        assert await auth.authenticate({"Authorization": "Bearer whatever"}) == Principal.anonymous()


def test_strip_credentials() -> None:
    headers = {"Authorization": "Bearer t", "x-api-key": "k", "COOKIE": "c", "Proxy-Authorization": "p",
               "Accept": "text/event-stream", "Mcp-Session-Id": "s"}
    assert strip_credentials(headers) == {"Accept": "text/event-stream", "Mcp-Session-Id": "s"}
    assert strip_credentials([("authorization", "a"), ("x-trace", "1")]) == {"x-trace": "1"}
