"""Re-make the dashboard screenshots of docs/dashboard.md (not part of the suite; ~3 min on 2 cores):

    HARNESSRL_SCREENSHOTS=docs/screenshots .venv/bin/pytest tests/dashboard/screenshots.py

(a pytest file so that it can import the tests' helpers; its name keeps it out of the default run,
and without the variable it skips). It trains two real tiny runs (``examples/tiny/train.toml`` at
lr 3e-2 and 1e-2), builds the tests' crafted run folder (a tool call, an audit flag, a chain break,
an advantage and harness logs), serves them with the dashboard and saves 1280-pixel-wide PNGs from
headless Chromium: ``runs.png`` (one run's charts), ``overlay.png`` (both runs overlaid),
``rollouts.png`` (the table sorted by duration), ``trace.png`` (the crafted trace), ``tokens.png`` (a
real rollout's token view) and ``compare.png``. ``HARNESSRL_SCREENSHOT_STEPS`` (default 12): steps
per run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from tests.dashboard.chromium import chromium
from tests.dashboard.conftest import ADMIN_KEY, build_crafted, train_tiny

from harnessrl.dashboard import create_dashboard_app
from harnessrl.gateway.server import serve_in_thread

RUNS = {"lr-3e-2": "optimizer.lr=0.03", "lr-1e-2": "optimizer.lr=0.01"}


def _shot(
    driver: Any, out: Path, name: str, url: str, *, scroll_to: str | None = None, height: int = 800
) -> None:
    """Open ``url``, put the element ``scroll_to`` (a CSS selector) at the top, save ``out/name``."""
    from selenium.webdriver.common.by import By

    # The viewport itself (a window's size includes what the browser draws around the page).
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    driver.get(url)
    if scroll_to is not None:
        driver.execute_script(
            "arguments[0].scrollIntoView()", driver.find_element(By.CSS_SELECTOR, scroll_to)
        )
    assert driver.save_screenshot(str(out / name)), name


def _best_vs_worst(driver: Any, base: str) -> str:
    """The compare URL that a group's "compare best vs worst" link opens."""
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/rollouts?group=g000008")
    return driver.find_element(By.PARTIAL_LINK_TEXT, "compare best vs worst").get_attribute("href")


@pytest.mark.skipif(not os.environ.get("HARNESSRL_SCREENSHOTS"), reason="set HARNESSRL_SCREENSHOTS=FOLDER")
def test_screenshots(tmp_path: Path) -> None:
    out = Path(os.environ["HARNESSRL_SCREENSHOTS"]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = int(os.environ.get("HARNESSRL_SCREENSHOT_STEPS", "12"))
    for name, lr in RUNS.items():
        train_tiny(tmp_path / "runs" / name, f"trainer.steps={steps}", lr)
    runs_app = create_dashboard_app(tmp_path / "runs", ADMIN_KEY)
    crafted_app = create_dashboard_app(build_crafted(tmp_path), ADMIN_KEY)
    with (
        serve_in_thread(runs_app) as runs,
        serve_in_thread(crafted_app) as one,
        chromium(1280, 800) as driver,
    ):
        driver.get(f"{runs}/ui/?key={ADMIN_KEY}")  # signs in (the cookie is per host, both servers')
        run = f"{runs}/ui/runs/lr-3e-2"
        _shot(driver, out, "overlay.png", f"{runs}/ui/?smooth=0.6")
        _shot(driver, out, "runs.png", f"{run}/?smooth=0.6")
        _shot(driver, out, "rollouts.png", f"{run}/rollouts?order=duration_desc")
        _shot(driver, out, "tokens.png", f"{run}/rollouts/g000008-r0", scroll_to="h3[id^=sample-]")
        _shot(driver, out, "compare.png", _best_vs_worst(driver, run))
        _shot(driver, out, "trace.png", f"{one}/ui/rollouts/r-hack", height=1200)
