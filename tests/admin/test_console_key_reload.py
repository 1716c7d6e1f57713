"""The console and a reload of the API key file: a console session opened with a key lasts only while that very
key is in the table in force and still makes an admin (pages, forms and live streams), and the principals the
console knows are the table's. The real gateway in-process; the console's real listener for the stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bastion.admin.session import COOKIE
from bastion.auth import hash_key
from tests.admin.test_console import ADMIN_KEY, USER_KEY, alice_session, console, login
from tests.admin.test_console_sessions import open_stream, rest_of

NEW_ADMIN_KEY = "bst_admin_key_rotated_0123456789abcdefgh"


def write_keys(tmp_path: Path, *entries: dict[str, Any]) -> None:
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump({"api_keys": list(entries)}))


def root(key: str = ADMIN_KEY, groups: tuple[str, ...] = ("admin",)) -> dict[str, Any]:
    return {"id": "root", "hash": hash_key(key), "groups": list(groups)}


ALICE = {"id": "alice", "hash": hash_key(USER_KEY), "groups": ["eng"]}


def reload_keys(door: Any) -> None:
    assert door.app.state.bastion.key_watcher.reload_now() is True


@pytest.mark.parametrize("change", ["removed", "rotated", "no longer an admin"])
async def test_a_console_session_ends_with_its_key(tmp_path: Path, change: str) -> None:
    write_keys(tmp_path, root(), ALICE)
    async with console(tmp_path, auth={"api_keys_file": "keys.yaml"}) as (door, browser):
        await login(browser)
        assert (await browser.get("/policy")).status_code == 200
        async with open_stream(door, "/live/stream", browser.cookies[COOKIE]) as stream:
            entries = {"removed": [ALICE], "rotated": [root(NEW_ADMIN_KEY), ALICE],
                       "no longer an admin": [root(groups=("eng",)), ALICE]}[change]
            write_keys(tmp_path, *entries)
            reload_keys(door)
            r = await browser.get("/policy")
            assert (r.status_code, r.headers.get("location")) == (303, "/login")
            # Activity the live stream would deliver: it checks its session first, and ends instead.
            await alice_session(door)
            rest = await rest_of(stream)
        assert [line for line in rest if line.startswith("data:")] == []
        if change == "rotated":
            # The new key is root again, in a new session.
            browser.cookies.clear()
            await login(browser, NEW_ADMIN_KEY)
            assert (await browser.get("/policy")).status_code == 200


async def test_a_session_outlives_reloads_that_keep_its_key(tmp_path: Path) -> None:
    write_keys(tmp_path, root(), ALICE)
    async with console(tmp_path, auth={"api_keys_file": "keys.yaml"}) as (door, browser):
        await login(browser)
        write_keys(tmp_path, root(), {**ALICE, "groups": ["ops"]})
        reload_keys(door)
        assert (await browser.get("/policy")).status_code == 200


async def test_the_principals_the_console_knows_are_the_tables_in_force(tmp_path: Path) -> None:
    write_keys(tmp_path, root(), ALICE)
    async with console(tmp_path, auth={"api_keys_file": "keys.yaml"}) as (door, browser):
        await login(browser)
        write_keys(tmp_path, root(), {"id": "carol", "hash": hash_key("bst_carol_" + "c" * 40), "groups": ["eng"]})
        reload_keys(door)
        page = (await browser.get("/catalogue", params={"principal": "carol"})).text
        assert '<span id="selected-principal">carol</span>' in page
        assert '<option value="carol" selected>carol (eng)</option>' in page
        gone = (await browser.get("/catalogue", params={"principal": "alice"})).text
        assert '<p class="error" id="unknown-principal">alice is not a principal' in gone
        assert '<option value="alice"' not in gone


async def test_a_key_session_ends_when_the_gateway_no_longer_has_api_keys(tmp_path: Path) -> None:
    # A key leaked: the operator drops API keys for JWTs and restarts. With a configured admin.secret the
    # console's cookies survive restarts, and a session opened with a key was let through whenever there was no
    # key table at all to check it against, for as long as admin.session_ttl_s.
    admin = {"port": 0, "secret": "s" * 40}
    async with console(tmp_path, admin=admin) as (_, browser):
        await login(browser)
        assert (await browser.get("/policy")).status_code == 200
        cookie = browser.cookies[COOKIE]
    jwt_only = {"resource": "https://bastion.example/mcp", "authorization_servers": ["https://idp.example"],
                "jwt": {"issuer": "https://idp.example", "jwks_url": "http://127.0.0.1:9/jwks"}}
    async with console(tmp_path, auth=jwt_only, admin=admin) as (_, browser):
        browser.cookies.set(COOKIE, cookie)
        r = await browser.get("/policy")
        assert (r.status_code, r.headers.get("location")) == (303, "/login")
