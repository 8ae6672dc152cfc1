"""Headless Chromium for the dashboard's browser tests and screenshots: Selenium driving Debian's
``chromium`` and ``chromium-driver`` (never a downloaded browser: Selenium Manager is kept quiet)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 800) -> Iterator[Any]:
    """A headless Chromium window of ``width`` x ``height`` CSS pixels; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM and CHROMEDRIVER, "chromium/chromium-driver not installed"
    os.environ.setdefault("SE_AVOID_STATS", "true")  # Selenium Manager: no telemetry, no downloads
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--hide-scrollbars", f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(arg)
    # Chromium keeps its profile's singleton lock in a folder of the temp folder and leaves it there
    # when it quits: its temp folder is one of ours, removed after it.
    with tempfile.TemporaryDirectory(prefix="harnessrl-chromium-") as tmp:
        service = Service(executable_path=CHROMEDRIVER, env={**os.environ, "TMPDIR": tmp})
        driver = webdriver.Chrome(service=service, options=options)
        try:
            yield driver
        finally:
            driver.quit()
