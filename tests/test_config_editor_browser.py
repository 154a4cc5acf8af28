"""The console's config editor in a real headless browser (chromium, chromedriver, selenium)
against a real server process with the config API on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from helpers.browser import chromium
from helpers.config_api import TOKENS, WRITE, Served
from helpers.server import wait_for

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

pytestmark = [pytest.mark.slow, pytest.mark.browser]

WEB = (
    "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def test_a_bad_edit_shows_its_line_and_a_good_one_saves(browser: WebDriver, tmp_path: Path) -> None:
    """An invalid unit is marked at its line before saving; a valid edit saves, and the
    new limit is the one ShouldRateLimit counts against."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "web.yaml").write_text(WEB)
    (tmp_path / "tokens").write_text(TOKENS)
    server = Served(
        tmp_path / "config", tmp_path, {"ADMIN_TOKENS_FILE": str(tmp_path / "tokens")}
    ).start()
    try:
        browser.get(f"http://127.0.0.1:{server.debug}/?refresh=1")
        browser.find_element("id", "editor-token").send_keys(WRITE)
        browser.find_element("id", "editor-use").click()
        text = browser.find_element("id", "editor-text")
        wait_for(
            "the document shown", lambda: "requests_per_unit: 3" in str(text.get_property("value"))
        )
        text.clear()
        text.send_keys(WEB.replace("unit: hour", "unit: hours"))
        bad = '#editor-gutter .bad[data-line="4"]'
        wait_for("line 4 marked", lambda: browser.find_elements("css selector", bad), timeout=10)
        assert "line 4" in browser.find_element("id", "editor-problems").text
        text.clear()
        text.send_keys(WEB.replace("requests_per_unit: 3", "requests_per_unit: 1"))
        wait_for(
            "no problem left",
            lambda: not browser.find_elements("css selector", "#editor-gutter .bad"),
            timeout=10,
        )
        browser.find_element("id", "editor-save").click()
        result = browser.find_element("id", "editor-result")
        wait_for("saved", lambda: "saved: version 2" in result.text, timeout=10)
        assert server.hit("web", ("user", "a")) == 200
        assert server.hit("web", ("user", "a")) == 429
    finally:
        browser.get("about:blank")
        server.stop()
