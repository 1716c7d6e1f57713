"""The console in a real browser: headless Chromium (Selenium) against a running gateway process.

One gateway, one browser, the admin's day in order: log in, watch an upstream go down and come back, watch a
denied call arrive in the live table, approve one held call and deny another as they arrive on the approvals page
(the client gets the tool's result, then the denial), approve a changed pin and see the tool back in the catalogue,
see what the policy hides from one principal, and be refused without credentials and without a CSRF token. With
``BASTION_SCREENSHOTS=docs/images`` each page is saved as PNG.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from bastion.auth.apikeys import hash_key
from tests.support.gateway import REPO, GatewayProcess
from tests.support.net import free_port
from tests.support.rpc import parse_body

# A missing browser fails here, never skips: .ci/test installs Debian's chromium and chromium-driver.
assert shutil.which("chromedriver") and shutil.which("chromium"), \
    "needs Debian chromium and chromium-driver (.ci/test installs them)"

ADMIN_KEY = "bst_browser_admin_key_0123456789abcdef"
USER_KEY = "bst_browser_user_key_0123456789abcdef"
POLICY = """version: 1
rules:
  - id: eng-echo
    effect: allow
    principals: {groups: [eng]}
    tools: ["basic__echo", "basic__mutate", "basic__crash"]
  - id: no-add-for-eng
    effect: deny
    principals: {groups: [eng]}
    tools: ["basic__add"]
  - id: echo-needs-an-admin
    effect: approve
    principals: {groups: [eng]}
    tools: ["basic__echo"]
    approval: {via: [admin], timeout: 60s, message: "An admin approves every echo"}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, int]]:
    workdir: Path = tmp_path_factory.mktemp("console")
    (workdir / "policy.yaml").write_text(POLICY)
    admin_port = free_port()
    gw = GatewayProcess({
        "auth": {"api_keys": [{"id": "root", "hash": hash_key(ADMIN_KEY), "groups": ["admin"]},
                              {"id": "alice", "hash": hash_key(USER_KEY), "groups": ["eng"]}]},
        "policies": [str(workdir / "policy.yaml")],
        "upstreams": {"basic": {"command": [sys.executable, "-m", "tests.fixtures.basic_server", "--transport",
                                            "stdio"], "cwd": str(REPO), "era": "legacy"}},
        "admin": {"host": "127.0.0.1", "port": admin_port},
        "approvals": {"admin_groups": ["admin"]},
    }, workdir).start()
    yield gw, admin_port
    gw.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    profile = tempfile.mkdtemp(prefix="bastion-chromium-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,900",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "chromium"
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def until(check: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or check}")


def shot(driver: Any, name: str) -> None:
    where = os.environ.get("BASTION_SCREENSHOTS")
    if where:
        target = REPO / where
        target.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(target / f"console-{name}.png"))


class Mcp:
    """A minimal legacy-session MCP client for alice (the calls the admin watches)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {USER_KEY}", "Accept": "application/json, text/event-stream"}
        r = httpx.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
            headers=self.headers, timeout=10)
        self.headers.update({"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"})
        httpx.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=self.headers)

    def call(self, tool: str, arguments: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                          "params": {"name": tool, "arguments": arguments}},
                          headers=self.headers, timeout=30)


class Held:
    """A call an approve rule holds: it runs in a thread until someone decides, then ``result`` is the tool's."""

    def __init__(self, client: Mcp, tool: str, arguments: dict[str, Any]) -> None:
        self.response: httpx.Response | None = None
        self.thread = threading.Thread(target=self._run, args=(client, tool, arguments), daemon=True)
        self.thread.start()

    def _run(self, client: Mcp, tool: str, arguments: dict[str, Any]) -> None:
        self.response = client.call(tool, arguments)

    def result(self, timeout: float = 20.0) -> dict[str, Any]:
        self.thread.join(timeout)
        assert self.response is not None, "the held call did not return"
        [message] = [m for m in parse_body(self.response) if "result" in m or "error" in m]
        assert "result" in message, message
        result: dict[str, Any] = message["result"]
        return result


def click(driver: Any, css: str, what: str) -> None:
    """Click what ``css`` finds now: the approvals table is re-rendered as events arrive, so an element found
    earlier may be gone."""
    until(lambda: (driver.find_element(By.CSS_SELECTOR, css).click(), True)[1], what=what)


def cell_text(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def test_an_admin_day_in_the_console(gateway: tuple[GatewayProcess, int], browser: Any) -> None:
    gw, port = gateway
    base = f"http://127.0.0.1:{port}"
    driver = browser

    # Refused without credentials: every page sends to the login form.
    driver.get(base + "/catalogue")
    until(lambda: driver.current_url.endswith("/login"), what="redirect to login")
    shot(driver, "login")
    driver.find_element(By.ID, "key").send_keys(USER_KEY)  # a valid key, but not an admin's
    driver.find_element(By.ID, "login").click()
    until(lambda: "not an admin credential" in driver.page_source, what="non-admin refused")

    # Log in.
    driver.find_element(By.ID, "key").send_keys(ADMIN_KEY)
    driver.find_element(By.ID, "login").click()
    until(lambda: driver.find_element(By.ID, "admin-id").text == "root", what="logged in")
    until(lambda: "up" in cell_text(driver, 'tr[data-upstream="basic"] .health'), what="basic up")
    shot(driver, "overview")

    # An upstream goes down and comes back: the overview refreshes itself, no reload.
    alice = Mcp(gw.url)
    alice.call("basic__crash", {})
    until(lambda: int(cell_text(driver, 'tr[data-upstream="basic"] td:nth-child(7)')) >= 1
          or "up" not in cell_text(driver, 'tr[data-upstream="basic"] .health').split(" ")[0],
          what="basic seen down or restarting")
    until(lambda: cell_text(driver, 'tr[data-upstream="basic"] .health').split(" ")[0] == "up",
          timeout=40, what="basic back up")
    assert int(cell_text(driver, 'tr[data-upstream="basic"] td:nth-child(7)')) >= 1

    # A denied call appears in the live table; a click shows the record, without arguments.
    driver.get(base + "/live?decision=deny")
    time.sleep(0.5)
    alice = Mcp(gw.url)
    alice.call("basic__add", {"a": 1, "b": 2, "note": "secret-argument"})
    row = until(lambda: driver.find_element(By.CSS_SELECTOR, "#live tbody tr.decision-deny"), what="denied row")
    assert "basic__add" in row.text and "no-add-for-eng" in row.text
    row.click()
    record = until(lambda: driver.find_element(By.ID, "record").text if "tool.call" in
                   driver.find_element(By.ID, "record").text else None, what="record shown")
    assert "secret-argument" not in record and '"alice"' in record
    shot(driver, "live")

    # A held call appears on the approvals page as it arrives (no reload), without its arguments.
    driver.get(base + "/approvals")
    until(lambda: driver.find_elements(By.ID, "no-approvals"), what="no approvals yet")
    held = Held(alice, "basic__echo", {"message": "approved-by-root"})
    row_css = 'tr[data-tool="basic__echo"]'
    row = until(lambda: driver.find_element(By.CSS_SELECTOR, row_css), what="held call shown live")
    assert "alice" in row.text and "echo-needs-an-admin" in row.text and "approved-by-root" not in row.text
    shot(driver, "approvals")
    # Refused without a CSRF token: the approve form, its token removed, decides nothing.
    driver.execute_script("const f = document.querySelector(arguments[0]);"
                          "f.querySelector('input[name=csrf]').remove(); f.submit();",
                          row_css + ' form[action="/approvals/approve"]')
    until(lambda: "CSRF token missing" in driver.page_source, what="CSRF refusal on approve")
    assert held.thread.is_alive()
    # Approved in the browser: the client's call returns the tool's result.
    driver.get(base + "/approvals")
    click(driver, row_css + " button.approve", "approve")
    assert held.result()["content"][0]["text"] == "approved-by-root"
    until(lambda: driver.find_elements(By.ID, "no-approvals"), what="approved call gone")
    # Denied in the browser: the client gets the denial, and the tool never ran.
    held = Held(alice, "basic__echo", {"message": "never-run"})
    click(driver, row_css + " button.deny", "deny")
    denied = held.result()
    assert denied["isError"] is True and "declined by an administrator" in denied["content"][0]["text"]
    until(lambda: driver.find_elements(By.ID, "no-approvals"), what="denied call gone")

    # A changed definition is quarantined; the admin reviews the diff and approves; the tool comes back.
    alice.call("basic__mutate", {})
    driver.get(base + "/catalogue")
    until(lambda: (driver.refresh(), "basic__echo" in cell_text(driver, "#hidden-tools"))[1], timeout=30,
          what="echo quarantined")
    shot(driver, "catalogue")
    driver.get(base + "/pins")
    section = until(lambda: driver.find_element(By.CSS_SELECTOR, 'section[data-pin="basic/echo"]'),
                    what="pending pin")
    assert section.find_elements(By.CSS_SELECTOR, "table.diff tr.chg")
    shot(driver, "pins")
    section.find_element(By.CSS_SELECTOR, "button.approve").click()
    until(lambda: driver.find_elements(By.ID, "no-pins"), what="pin approved")
    driver.get(base + "/catalogue")
    until(lambda: (driver.refresh(), "basic__echo" in cell_text(driver, "#visible-tools"))[1], timeout=30,
          what="echo back in the catalogue")
    assert "basic__echo" not in cell_text(driver, "#hidden-tools")

    # What the policy hides from alice, by the rule that hides it: choosing her submits the form.
    Select(driver.find_element(By.ID, "principal")).select_by_value("alice")
    until(lambda: driver.find_element(By.ID, "selected-principal").text == "alice", what="alice chosen")
    add_row = driver.find_element(By.CSS_SELECTOR, '#hidden-tools tr[data-tool="basic__add"]')
    assert add_row.get_attribute("data-why") == "policy" and "no-add-for-eng" in add_row.text
    assert "approve: echo-needs-an-admin" in cell_text(driver, '#visible-tools tr[data-tool="basic__echo"]')
    shot(driver, "catalogue-principal")

    # The policy page and its explain form.
    driver.get(base + "/policy")
    form = driver.find_element(By.ID, "explain")
    form.find_element(By.NAME, "principal").send_keys("alice")
    form.find_element(By.NAME, "groups").send_keys("eng")
    form.find_element(By.NAME, "tool").send_keys("basic__add")
    form.find_element(By.CSS_SELECTOR, "button").click()
    until(lambda: driver.find_element(By.ID, "decision").text == "deny", what="explained")
    assert driver.find_element(By.ID, "rule").text == "no-add-for-eng"
    assert driver.find_element(By.ID, "principal-source").get_attribute("data-source") == "api_key"
    shot(driver, "policy")

    # Refused without a CSRF token: the same form, its token removed, is rejected and nothing is decided.
    driver.get(base + "/policy")
    driver.execute_script("document.querySelector('#explain input[name=csrf]').remove()")
    driver.find_element(By.CSS_SELECTOR, "#explain button").click()
    until(lambda: "CSRF token missing" in driver.page_source, what="CSRF refusal")

    # Every admin action is in the audit log, with the admin's id.
    actions = gw.records("admin.action")
    assert {("login", "ok"), ("pin.approve", "ok"), ("policy.explain", "ok"), ("policy.explain", "refused"),
            ("login_failed", "refused"), ("approval.approve", "refused"), ("approval.approve", "ok"),
            ("approval.deny", "ok")} <= {(r["action"], r["outcome"]) for r in actions}
    assert all(r["principal"]["id"] == "root" for r in actions if r["action"] != "login_failed")
    approvals = gw.records("pin.approve")
    assert any(r["tool"] == "echo" and r["approved_by"] == "root" for r in approvals)
    decided = gw.records("approval.decided")
    assert [(r["approval"]["outcome"], r["approval"]["channel"], r["principal"]["id"]) for r in decided] == \
        [("approved", "console", "root"), ("declined", "console", "root")]

    # Logged out (cookies gone): refused again.
    driver.delete_all_cookies()
    driver.get(base + "/pins")
    until(lambda: driver.current_url.endswith("/login"), what="refused after logout")
