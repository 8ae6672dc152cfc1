"""The dashboard in headless Chromium (Selenium + Debian's chromium/chromium-driver): sign in, read
the charts, sort and filter the table, click through to a trace, its logs and a compare, and read
several runs overlaid. One Chromium for the module; skipped when it or Selenium is missing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.dashboard.chromium import CHROMEDRIVER, CHROMIUM, chromium
from tests.dashboard.conftest import ADMIN_KEY, RunFolder, make_run_folder

from harnessrl.dashboard import create_dashboard_app
from harnessrl.dashboard.charts import COLORS
from harnessrl.gateway.server import serve_in_thread

pytest.importorskip("selenium.webdriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER), reason="chromium/chromium-driver not installed"
)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium(1280, 900) as d:
        yield d


@pytest.fixture(scope="module")
def url(tiny_run: RunFolder) -> Iterator[str]:
    """The tiny run's dashboard."""
    with serve_in_thread(create_dashboard_app(tiny_run.path, ADMIN_KEY)) as base:
        yield base


@pytest.fixture(scope="module")
def overlay_url(tiny_run: RunFolder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tiny run beside a second (made-up) run: the several-runs dashboard."""
    other = tmp_path_factory.mktemp("overlay") / "other"
    metrics = [{"step": s, "time": 1e9 + 30 * s, "reward/mean": 0.1 * s, "loss": 1 / s} for s in (1, 2, 3)]
    make_run_folder(other, "other", metrics)
    with serve_in_thread(create_dashboard_app([tiny_run.path, other], ADMIN_KEY)) as base:
        yield base


def _wait(driver: Any, condition: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 20).until(condition)  # clicks navigate asynchronously


def _column(driver: Any, name: str) -> list[str]:
    """The cells of the rollouts table's column ``name`` (found by its header)."""
    from selenium.webdriver.common.by import By

    headers = [th.text.rstrip(" ↑↓") for th in driver.find_elements(By.CSS_SELECTOR, "#rollouts th")]
    i = headers.index(name) + 1
    return [td.text for td in driver.find_elements(By.CSS_SELECTOR, f"tr.rollout-row td:nth-child({i})")]


def test_click_through_runs_rollouts_trace_compare(driver: Any, url: str, tiny_run: RunFolder) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/ui/")
    assert "Sign in" in driver.title
    driver.find_element(By.NAME, "key").send_keys(ADMIN_KEY)
    driver.find_element(By.CSS_SELECTOR, "form button").click()
    _wait(driver, lambda d: d.find_elements(By.TAG_NAME, "h2"))
    assert "tiny-vowels" in driver.find_element(By.TAG_NAME, "h2").text
    # Every logged scalar is charted, in groups (reward, policy health, rollouts, throughput, other).
    groups = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "h3.chart-group")]
    assert groups == ["Reward", "Policy health", "Rollouts", "Throughput"]
    assert len(driver.find_elements(By.CSS_SELECTOR, "svg.chart")) >= 15

    driver.find_element(By.LINK_TEXT, "Rollouts").click()
    _wait(driver, lambda d: "/ui/rollouts" in d.current_url)
    # 2 trained steps of 2 groups x 8, plus whatever the async feeder had in flight (whole groups).
    count = len(driver.find_elements(By.CSS_SELECTOR, "tr.rollout-row"))
    assert count >= 32 and count % 8 == 0
    driver.find_element(By.NAME, "group").send_keys("g000001")
    driver.find_element(By.CSS_SELECTOR, "form.filters button").click()
    _wait(driver, lambda d: "group=g000001" in d.current_url)
    rows = driver.find_elements(By.CSS_SELECTOR, "tr.rollout-row")
    assert len(rows) == 8 and all("g000001" in row.text for row in rows)

    rows[-1].find_element(By.CSS_SELECTOR, "a.trace-link").click()  # newest first: r0 is last
    first = tiny_run.rollout_id(1, 0)
    _wait(driver, lambda d: f"/ui/rollouts/{first}" in d.current_url)
    assert driver.find_element(By.TAG_NAME, "h1").text.startswith(f"Rollout {first}")
    sampled = driver.find_elements(By.CSS_SELECTOR, ".tokens .tok.smp")
    assert sampled and "logprob" in sampled[0].get_attribute("title")
    assert "reply with vowels only" in driver.find_element(By.CSS_SELECTOR, ".conversation").text

    driver.back()
    _wait(driver, lambda d: "group=g000001" in d.current_url)
    driver.find_element(By.PARTIAL_LINK_TEXT, "compare best vs worst").click()
    _wait(driver, lambda d: "/ui/compare" in d.current_url)
    assert len(driver.find_elements(By.CSS_SELECTOR, ".compare .side")) == 2


def test_table_sorts_by_clicked_headers_and_filters_by_split_and_step(driver: Any, url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(f"{url}/ui/rollouts?key={ADMIN_KEY}")
    driver.find_element(By.LINK_TEXT, "reward").click()
    _wait(driver, lambda d: "order=reward_desc" in d.current_url)
    rewards = [float(r) for r in _column(driver, "reward") if r]
    assert len(rewards) > 8 and rewards == sorted(rewards, reverse=True)
    driver.find_element(By.LINK_TEXT, "reward").click()  # again: the other way
    _wait(driver, lambda d: "order=reward_asc" in d.current_url)
    rewards = [float(r) for r in _column(driver, "reward") if r]
    assert rewards == sorted(rewards)
    driver.find_element(By.LINK_TEXT, "duration").click()
    _wait(driver, lambda d: "order=duration_desc" in d.current_url)
    durations = [float(d.rstrip("s")) for d in _column(driver, "duration") if d]
    assert durations == sorted(durations, reverse=True)

    Select(driver.find_element(By.NAME, "split")).select_by_visible_text("train")
    driver.find_element(By.NAME, "step").send_keys("0")
    driver.find_element(By.CSS_SELECTOR, "form.filters button").click()
    _wait(driver, lambda d: "split=train" in d.current_url and "step=0" in d.current_url)
    assert set(_column(driver, "split")) == {"train"} and set(_column(driver, "step")) == {"0"}
    assert "order=duration_desc" in driver.current_url  # the sort is kept while filtering
    assert [o.text for o in Select(driver.find_element(By.NAME, "flag")).options] == ["any"]  # no flags


def test_trace_shows_trained_at_step_advantage_and_opens_logs(
    driver: Any, url: str, tiny_run: RunFolder
) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/ui/rollouts/{tiny_run.rollout_id(0, 0)}?key={ADMIN_KEY}")
    summary = {
        row.find_element(By.CSS_SELECTOR, "td:first-child").text: row.find_element(
            By.CSS_SELECTOR, "td:last-child"
        ).text
        for row in driver.find_elements(By.CSS_SELECTOR, "table.kv:first-of-type tr")
    }
    assert summary["split"] == "train" and summary["created at step"] == "0"
    assert summary["trained at step"].isdigit() and "advantage" in summary
    links = driver.find_elements(By.CSS_SELECTOR, "a.log-link")
    assert [link.text for link in links] == ["stdout", "stderr"] and "attempt 0:" in summary["harness logs"]
    links[0].click()
    _wait(driver, lambda d: d.current_url.endswith("/logs/0/stdout"))
    log = tiny_run.path / "rollouts" / tiny_run.rollout_id(0, 0) / "attempt-0" / "stdout.log"
    assert driver.find_element(By.TAG_NAME, "body").text.strip() == log.read_text().strip()


def test_several_runs_overlaid_with_one_colour_each(driver: Any, overlay_url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(f"{overlay_url}/ui/?key={ADMIN_KEY}")
    runs = [row.get_attribute("data-run") for row in driver.find_elements(By.CSS_SELECTOR, "tr.run-row")]
    assert runs == ["run", "other"]
    reward = driver.find_element(By.CSS_SELECTOR, 'svg[aria-label="Reward"]')
    strokes = {line.get_attribute("stroke") for line in reward.find_elements(By.TAG_NAME, "polyline")}
    assert strokes == {COLORS[0], COLORS[1]}
    Select(driver.find_element(By.NAME, "smooth")).select_by_visible_text("0.9")
    driver.find_element(By.CSS_SELECTOR, "form.chart-options button").click()
    _wait(driver, lambda d: "smooth=0.9" in d.current_url)
    assert driver.find_elements(By.CSS_SELECTOR, "svg.chart polyline.smoothed")
    driver.find_element(By.LINK_TEXT, "other").click()
    _wait(driver, lambda d: d.current_url.endswith("/ui/runs/other/"))
    driver.find_element(By.LINK_TEXT, "Rollouts").click()
    _wait(driver, lambda d: "/ui/runs/other/rollouts" in d.current_url)
    assert [a.text for a in driver.find_elements(By.CSS_SELECTOR, "a.trace-link")] == ["other-r0"]
    driver.find_element(By.LINK_TEXT, "All runs").click()
    _wait(driver, lambda d: d.current_url.rstrip("/").endswith("/ui"))
