"""The console's tier simulator in a real headless browser (chromium, chromedriver and
selenium), against a real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ferryman.backends.memory import MemoryBackend

from helpers.browser import chromium
from helpers.server import ConfigDir, ServerFactory, wait_for

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CONFIG = """
domain: cookbook
descriptors:
  - key: penalty_user
    burst_tiers:
      - {limit: 5, window: 1s, active: 1d, cooldown: 0}
      - {limit: 50, window: 1s, active: 5s, cooldown: 15s}
"""


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def test_the_simulator_draws_a_burst_and_its_cooldown_without_touching_the_counters(
    browser: WebDriver, config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A node of the configuration in force, 20 a second for 30 s: the page shows every
    request granted in the burst tier for 5 s, then 5 a second in the first tier during the
    cooldown; the server's own counters stay empty; a pasted node that is not YAML of a
    node shows its error."""
    config_dir.write("cookbook.yaml", CONFIG)
    server = make_server()
    browser.get(f"http://127.0.0.1:{server.service.debug_port}/?refresh=60")

    def fill(element_id: str, value: str) -> None:
        field = browser.find_element("id", element_id)
        field.clear()
        field.send_keys(value)

    def submit() -> str:
        browser.execute_script("document.getElementById('sim-result').replaceChildren()")
        browser.find_element("id", "sim-submit").click()
        wait_for("the simulation", lambda: browser.find_element("id", "sim-result").text)
        return str(browser.find_element("id", "sim-result").text)

    fill("sim-domain", "cookbook")
    fill("sim-descriptor", "penalty_user=alice")
    fill("sim-rate", "20")
    fill("sim-seconds", "30")
    shown = submit()
    rows = browser.find_elements("css selector", "#sim-table tbody tr")
    assert len(rows) == 30
    cells = [[td.text for td in row.find_elements("tag name", "td")] for row in rows]
    granted = sum(int(c[2]) for c in cells)
    assert f"{granted} of 600 requests granted" in shown
    assert [c[2] for c in cells[:5]] == ["20"] * 5 and [c[2] for c in cells[6:20]] == ["5"] * 14
    assert cells[0][:4] == ["0", "20", "20", "0"] and "active_tier_index=2" in cells[0][4]
    assert cells[10][:4] == ["10", "20", "5", "15"] and "active_tier_index=1" in cells[10][4]
    series = [
        e.get_attribute("data-series")
        for e in browser.find_elements("css selector", "#sim-chart polyline")
    ]
    assert series == ["asked", "granted", "refused", "active_tier_index"]
    backend = server.service.backend
    assert isinstance(backend, MemoryBackend) and len(backend.counters) == 0
    logged = browser.get_log("browser")  # type: ignore[no-untyped-call]
    assert [e for e in logged if e["level"] == "SEVERE"] == []
    fill("sim-descriptor", "")
    fill("sim-node", "[1, 2]")
    assert "give the node's keys as a YAML map" in submit()
