"""The console's config editor in a real headless browser (chromium, chromedriver, selenium)
against a real server process with the config API on."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from helpers.config_api import TOKENS, WRITE, Served
from helpers.needs import missing
from helpers.server import wait_for

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WEB = (
    "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service as DriverService
    except ImportError:
        missing("selenium is not installed (pip install -e '.[test]')")
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not (os.access(binary, os.X_OK) or shutil.which(Path(binary).name)):
            missing(f"{binary} is not installed (apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="ferryman-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if os.access(CHROMIUM, os.X_OK) else "chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver_path = CHROMEDRIVER if os.access(CHROMEDRIVER, os.X_OK) else shutil.which("chromedriver")
    driver = webdriver.Chrome(service=DriverService(driver_path), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


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
