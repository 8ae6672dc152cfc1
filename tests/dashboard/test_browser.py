"""The dashboard in headless Chromium (Selenium + Debian's chromium/chromium-driver): load each page,
filter the table, click through to a trace and to a compare. Skipped when either is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from tests.dashboard.conftest import ADMIN_KEY, RunFolder

from harnessrl.dashboard import create_dashboard_app
from harnessrl.gateway.server import serve_in_thread

webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER), reason="chromium/chromium-driver not installed"
)


@pytest.fixture(scope="module")
def browser(tiny_run: RunFolder) -> Iterator[tuple[object, str]]:
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_AVOID_STATS", "true")  # Selenium Manager: no telemetry, no downloads
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1280,900"):  # fmt: skip
        options.add_argument(arg)
    with serve_in_thread(create_dashboard_app(tiny_run.path, ADMIN_KEY)) as url:
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        try:
            yield driver, url
        finally:
            driver.quit()


def test_click_through_runs_rollouts_trace_compare(browser: tuple[object, str]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver, url = browser
    driver.get(f"{url}/ui/")  # type: ignore[attr-defined]
    assert "Sign in" in driver.title  # type: ignore[attr-defined]
    driver.find_element(By.NAME, "key").send_keys(ADMIN_KEY)  # type: ignore[attr-defined]
    driver.find_element(By.CSS_SELECTOR, "form button").click()  # type: ignore[attr-defined]
    WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.TAG_NAME, "h2"))
    assert "tiny-vowels" in driver.find_element(By.TAG_NAME, "h2").text  # type: ignore[attr-defined]
    # Every logged scalar is charted, in groups (reward, policy health, rollouts, throughput, other).
    groups = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "h3.chart-group")]  # type: ignore[attr-defined]
    assert groups == ["Reward", "Policy health", "Rollouts", "Throughput"]
    assert len(driver.find_elements(By.CSS_SELECTOR, "svg.chart")) >= 15  # type: ignore[attr-defined]

    driver.find_element(By.LINK_TEXT, "Rollouts").click()  # type: ignore[attr-defined]
    WebDriverWait(driver, 20).until(lambda d: "/ui/rollouts" in d.current_url)
    # 2 trained steps of 2 groups x 8, plus whatever the async feeder had in flight (whole groups).
    count = len(driver.find_elements(By.CSS_SELECTOR, "tr.rollout-row"))  # type: ignore[attr-defined]
    assert count >= 32 and count % 8 == 0
    driver.find_element(By.NAME, "group").send_keys("g000001")  # type: ignore[attr-defined]
    driver.find_element(By.CSS_SELECTOR, "form.filters button").click()  # type: ignore[attr-defined]
    # Clicks navigate asynchronously: wait for the new page before reading it.
    WebDriverWait(driver, 20).until(lambda d: "group=g000001" in d.current_url)
    rows = driver.find_elements(By.CSS_SELECTOR, "tr.rollout-row")  # type: ignore[attr-defined]
    assert len(rows) == 8 and all("g000001" in row.text for row in rows)

    rows[-1].find_element(By.CSS_SELECTOR, "a.trace-link").click()  # newest first: r0 is last
    WebDriverWait(driver, 20).until(lambda d: "/ui/rollouts/g000001" in d.current_url)
    assert driver.find_element(By.TAG_NAME, "h1").text.startswith("Rollout g000001-r0")  # type: ignore[attr-defined]
    sampled = driver.find_elements(By.CSS_SELECTOR, ".tokens .tok.smp")  # type: ignore[attr-defined]
    assert sampled and "logprob" in sampled[0].get_attribute("title")
    assert "reply with vowels only" in driver.find_element(By.CSS_SELECTOR, ".conversation").text  # type: ignore[attr-defined]

    driver.back()  # type: ignore[attr-defined]
    WebDriverWait(driver, 20).until(lambda d: "group=g000001" in d.current_url)
    driver.find_element(By.PARTIAL_LINK_TEXT, "compare best vs worst").click()  # type: ignore[attr-defined]
    WebDriverWait(driver, 20).until(lambda d: "/ui/compare" in d.current_url)
    assert len(driver.find_elements(By.CSS_SELECTOR, ".compare .side")) == 2  # type: ignore[attr-defined]
