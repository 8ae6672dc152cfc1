"""``install.sh`` tries each package install a second time: a download damaged on its way through
the proxy (a pip hash mismatch was seen once, and the same command a moment later worked) must not
fail a fresh machine's setup, nor a CI run. The shell function itself is run here, from the script."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

INSTALL = Path(__file__).resolve().parents[2] / "install.sh"


def run_retried(tmp_path: Path, fails_first: int) -> subprocess.CompletedProcess[str]:
    """``retried`` (as install.sh defines it) around a command that fails its first ``fails_first``
    runs; ``sleep`` made a no-op so the pause costs nothing here."""
    [function] = re.findall(r"^retried\(\) \{\n.*?^\}\n", INSTALL.read_text(), flags=re.S | re.M)
    counter = tmp_path / "runs"
    script = (
        "set -euo pipefail\n"
        "sleep() { :; }\n"
        f"{function}"
        f"flaky() {{ echo x >> {counter}; [ $(wc -l < {counter}) -gt {fails_first} ]; }}\n"
        "retried flaky\n"
        "echo done\n"
    )
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_an_install_that_fails_once_is_tried_again_and_the_setup_goes_on(tmp_path):
    done = run_retried(tmp_path, fails_first=1)
    assert done.returncode == 0 and done.stdout == "done\n"
    assert "'flaky' failed; trying once more" in done.stderr
    assert (tmp_path / "runs").read_text().count("x") == 2


def test_an_install_that_fails_twice_stops_the_setup(tmp_path):
    done = run_retried(tmp_path, fails_first=2)
    assert done.returncode != 0 and "done" not in done.stdout  # set -e: nothing after it runs
    assert (tmp_path / "runs").read_text().count("x") == 2  # tried twice, not more


def test_every_package_install_of_the_main_venv_is_retried():
    """Control on the script itself: no bare pip install into .venv is left (one added later
    without ``retried`` would fail a setup on one damaged download again)."""
    lines = [line.strip() for line in INSTALL.read_text().splitlines()]
    bare = [line for line in lines if line.startswith('"${PIP[@]}"') or line.startswith('"${VPIP[@]}"')]
    assert bare == []
    assert sum(line.startswith('retried "${PIP[@]}"') for line in lines) >= 4
