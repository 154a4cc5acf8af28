"""The console in a real headless browser (Debian's chromium, chromedriver and selenium)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import ferryman
from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman._proto.quotaservice import quota_service_pb2

from helpers.browser import chromium
from helpers.capacity import resources_yaml
from helpers.server import ConfigDir, Server, ServerFactory, quota_stub, wait_for

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[1]
FRONT = str(ROOT / "envoy" / "front-proxy.yaml")
# The elements that reach past the right edge of the screen.
WIDER_THAN_SCREEN = """
const width = document.documentElement.clientWidth;
return [...document.querySelectorAll("body *")]
  .filter((e) => e.getBoundingClientRect().right > width + 1)
  .slice(0, 5).map((e) => `${e.tagName}#${e.id}.${e.className} ${e.getBoundingClientRect().right}`);
"""
CONFIG = """
domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: bulk
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    burst_tiers:
      - {limit: 2, window: 1s, active: 1h}
      - {limit: 10, window: 1s, active: 1m, cooldown: 2m}
"""
JOBS = """
domain: jobs
descriptors:
  - key: tenant
    copies:
      limit: 10
      groups:
        - {name: everyone, limit: 20, members: ["*"]}
"""

SMOOTH = """
domain: api
descriptors:
  - key: client
    token_bucket: {size: 20, fill_rate: 5, max_debt_millis: 4000}
"""
QUOTA = """
namespaces:
  pay:
    buckets:
      card: {size: 10, fill_rate: 10, max_debt_millis: 2000}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """One headless chromium for the module, on a fresh profile."""
    with chromium() as driver:
        yield driver


@pytest.fixture
def page(browser: WebDriver, make_server: ServerFactory) -> Iterator[WebDriver]:
    """The browser for one test; it leaves the console before the test's servers stop, so
    that the page's polling of a stopped server is no error of the next test."""
    browser.get("about:blank")
    browser.get_log("browser")  # type: ignore[no-untyped-call]
    yield browser
    browser.get("about:blank")
    browser.get_log("browser")  # type: ignore[no-untyped-call]


def open_console(browser: WebDriver, server: Server) -> None:
    browser.get(f"http://127.0.0.1:{server.service.debug_port}/?refresh=0.3")
    wait_for("the configuration drawn", lambda: text(browser, "domains") != "loading…")


def text(browser: WebDriver, element_id: str) -> str:
    return str(browser.find_element("id", element_id).text)


def script(browser: WebDriver, js: str, *args: Any) -> Any:
    return browser.execute_script(js, *args)


def errors(browser: WebDriver) -> list[dict[str, Any]]:
    """The browser console's errors since the last call (failed loads, script errors)."""
    logged: list[dict[str, Any]] = browser.get_log("browser")  # type: ignore[no-untyped-call]
    return [e for e in logged if e["level"] == "SEVERE"]


def sample(server: Server) -> None:
    """A sample now, on the server's loop, instead of waiting for the sampler's period."""

    async def take() -> None:
        server.service.console.sampler.sample()

    server.run(take())


def chart_total(browser: WebDriver, chart: str) -> int:
    value = script(browser, f"return document.getElementById({chart!r}).dataset.total || '0'")
    return int(value)


def test_console_shows_the_configuration_and_live_traffic(
    page: WebDriver, config_dir: ConfigDir, make_server: ServerFactory, tmp_path: Path
) -> None:
    """The page loads without a console error and shows the domains as trees; after
    traffic the charts' numbers, the top over-limit table, the burst tiers (and a tenant's),
    the held resources, the leases and the token buckets move; it fits a phone's width. A
    screenshot is kept."""
    browser = page
    config_dir.write("web.yaml", CONFIG)
    config_dir.write("jobs.yaml", JOBS)
    config_dir.write("api.yaml", SMOOTH)
    config_dir.write("quota.yaml", QUOTA)
    config_dir.write("resources.yaml", resources_yaml(capacity=120, lease=60))
    server = make_server()
    open_console(browser, server)
    assert errors(browser) == []
    domains = text(browser, "domains")
    assert "web" in domains and "jobs" in domains
    assert "3 per minute" in domains and "burst tiers" in domains and "copies" in domains
    assert "shadow" in domains
    assert "config v1" in text(browser, "config-version")
    assert not browser.find_element("id", "config-error").is_displayed()
    before = chart_total(browser, "chart-outcomes")

    for _ in range(6):
        server.ask("web", [("user", "alice")])
        server.ask("web", [("bulk", "b")])
        server.ask("web", [("tenant", "t")])
    for _ in range(25):
        server.ask("api", [("client", "mobile")])
    for tokens in (10, 5):
        allow = quota_service_pb2.AllowRequest(
            namespace="pay", bucket_name="card", tokens_requested=tokens
        )
        quota_stub(server.channel).Allow(allow, timeout=10)
    leases = doorman_pb2_grpc.CapacityStub(server.channel)  # type: ignore[no-untyped-call]
    for client_id, wants in (("batch-1", 100), ("batch-2", 40)):
        lease = doorman_pb2.GetCapacityRequest(client_id=client_id)
        lease.resource.add(resource_id="fair", priority=1, wants=wants)
        leases.GetCapacity(lease, timeout=10)
    target = f"127.0.0.1:{server.service.grpc_port}"
    with (
        ferryman.Client(target, fail_open=False) as client,
        client.hold_copy("jobs", {"tenant": "acme"}, copies=4) as hold,
    ):
        assert hold.success
        sample(server)
        wait_for("the outcome chart to move", lambda: chart_total(browser, "chart-outcomes") > 0)
        assert before == 0 and chart_total(browser, "chart-outcomes") == 43
        assert chart_total(browser, "chart-domains") == 43
        wait_for("the top over-limit table", lambda: "web: user" in text(browser, "top-over-limit"))
        assert "web: bulk" in text(browser, "top-over-limit")
        legend = text(browser, "chart-outcomes")
        assert "OK" in legend and "over limit" in legend and "shadow" in legend
        assert "current tier: 2, active until" in text(browser, "burst-nodes")
        browser.find_element("id", "tenant-domain").send_keys("web")
        browser.find_element("id", "tenant-descriptor").send_keys("tenant=t")
        browser.find_element("id", "tenant-submit").click()
        wait_for("the tenant's tiers", lambda: "current tier 2" in text(browser, "tenant-result"))
        tiers = text(browser, "tenant-result")
        assert "tier 2 active 4 / 10 per 1s 60.0s 180.0s" in tiers, tiers
        wait_for("the held copies", lambda: "copies held" in text(browser, "holds-gauges"))
        gauges = text(browser, "holds-gauges")
        assert gauges.splitlines()[:4] == ["1", "sessions", "4", "copies held"], gauges
        assert "everyone" in text(browser, "holds-groups")
        wait_for("the sessions panel", lambda: "4" in text(browser, "panels"))
        assert "Sessions" in text(browser, "panels")
        wait_for("the token buckets", lambda: "pay/card" in text(browser, "panels"))
        panels = text(browser, "panels")
        assert "pay/card quota -5 10 10 500" in panels, panels
        assert "api.client|mobile descriptor -1 20 5 200" in panels, panels
        assert "fair batch-1 1 100 100 60" in panels and "fair batch-2 1 40" in panels, panels

        height = script(browser, "return document.documentElement.scrollHeight")
        browser.set_window_size(1280, min(int(height) + 140, 4000))
        shot = tmp_path / "ferryman-console.png"
        browser.save_screenshot(str(shot))
        print(f"console screenshot: {shot}")
        wanted = os.environ.get("FERRYMAN_CONSOLE_SCREENSHOT")
        if wanted:
            shutil.copyfile(shot, wanted)
    assert shot.stat().st_size > 10_000

    # A phone: 390 CSS pixels wide, as the browser's device emulation sets it.
    phone = {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", phone)
    try:
        wait_for("the page to fit a phone", lambda: not script(browser, WIDER_THAN_SCREEN))
    except AssertionError:
        raise AssertionError(f"wider than a phone: {script(browser, WIDER_THAN_SCREEN)}") from None
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert errors(browser) == []


def test_a_bad_configuration_shows_its_error_until_a_good_load(
    page: WebDriver, config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A rejected reload puts its error on the page in red, the configuration in force
    still drawn; a good load removes it."""
    browser = page
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    open_console(browser, server)
    config_dir.write("web.yaml", CONFIG + "  - key: broken\n    rate_limit: {unit: fortnight}\n")
    banner = browser.find_element("id", "config-error")
    wait_for("the error banner", banner.is_displayed, timeout=10)
    assert "fortnight" in banner.text and "web.yaml" in banner.text
    color = script(browser, "return getComputedStyle(arguments[0]).color", banner)
    red, green, blue = (int(c) for c in color[color.index("(") + 1 : -1].split(",")[:3])
    assert red > 2 * green and red > 2 * blue, color
    assert "3 per minute" in text(browser, "domains")
    config_dir.write("web.yaml", CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 4"))
    wait_for("the banner to go", lambda: not banner.is_displayed(), timeout=10)
    wait_for("the new configuration", lambda: "4 per minute" in text(browser, "domains"))
    assert "config v2" in text(browser, "config-version")
    assert errors(browser) == []


def test_the_explain_form_answers(
    page: WebDriver, config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """The form asks /explain: the walk, the rule and the current count for a match (a
    bucket's tokens, a sliding window's estimate); the level where the walk stopped for a
    miss; the error for an unknown domain."""
    browser = page
    config_dir.write("web.yaml", CONFIG)
    config_dir.write(
        "smooth.yaml",
        "domain: smooth\ndescriptors:\n"
        "  - key: bucket\n    token_bucket: {size: 4, fill_rate: 1}\n"
        "  - key: sliding\n    sliding_window: {unit: minute, requests_per_unit: 5}\n",
    )
    server = make_server()
    server.ask("web", [("user", "bob")])
    server.ask("smooth", [("bucket", "u")], [("sliding", "u")])
    open_console(browser, server)

    def ask(domain: str, descriptors: str) -> str:
        for element_id, value in (
            ("explain-domain", domain),
            ("explain-descriptors", descriptors),
        ):
            field = browser.find_element("id", element_id)
            field.clear()
            field.send_keys(value)
        script(browser, "document.getElementById('explain-result').replaceChildren()")
        browser.find_element("id", "explain-submit").click()
        wait_for("the answer", lambda: text(browser, "explain-result"))
        return text(browser, "explain-result")

    answer = ask("web", "user=bob")
    assert "descriptor[0] user=bob" in answer
    assert "user=bob: bare key" in answer
    assert "3 per minute" in answer
    assert "now: 1 counted, 2 left" in answer
    missed = ask("web", "nobody=x")
    assert "no match" in missed and "this level has: user, bulk, tenant" in missed
    smooth = ask("smooth", "bucket=u\nsliding=u")
    assert "size 4, 1 per second" in smooth and "now: 3 tokens, 3 left" in smooth
    assert "5 per minute" in smooth and "now: 1 counted (estimate), 4 left" in smooth
    unknown = ask("nowhere", "user=bob")
    assert "'nowhere' is not configured" in unknown
    assert errors(browser) == []


def test_the_envoy_route_picker_shows_what_a_route_sends(
    page: WebDriver, make_server: ServerFactory
) -> None:
    """Without Envoy files the route picker stays hidden; with the shipped front proxy and
    descriptors it lists the routes, and a route shows each descriptor Envoy sends and what
    it reaches (a header given: the walk and the count)."""
    browser = page
    open_console(browser, make_server())
    assert not browser.find_element("id", "envoy-form").is_displayed()
    server = make_server(config_dir=ROOT / "descriptors", envoy_config_files=(FRONT,))
    open_console(browser, server)
    wait_for("the route picker", lambda: browser.find_element("id", "envoy-form").is_displayed())
    routes = script(browser, "return [...document.getElementById('envoy-route').options]"
                    ".map((o) => o.value)")  # fmt: skip
    assert "/api/" in routes and "/burst/simple" in routes

    def ask(route: str, headers: str) -> str:
        script(browser, "document.getElementById('envoy-route').value = arguments[0]", route)
        field = browser.find_element("id", "envoy-headers")
        field.clear()
        field.send_keys(headers)
        script(browser, "document.getElementById('envoy-result').replaceChildren()")
        browser.find_element("id", "envoy-submit").click()
        wait_for("the answer", lambda: text(browser, "envoy-result"))
        return text(browser, "envoy-result")

    simple = ask("/burst/simple", "")
    assert "route /burst/simple → domain cookbook" in simple
    assert "simple_user=<header x-user-id>" in simple and "burst tiers" in simple
    assert "not sent at all when header x-user-id missing" in simple
    api = ask("/api/", ":path=/api/v1")
    assert "generic_key=slow-path: exact" in api and "10 per second" in api
    assert "now: 0 counted, 10 left" in api
    assert errors(browser) == []
