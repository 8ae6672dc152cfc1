"""Ctrl-C (SIGINT) and SIGTERM while ``harnessrl data calibrate`` builds its tasks' image (the
pre-flight, in a worker thread), through the real command in a real process.

Ctrl-C only cancelled the waiting task and ``asyncio.run`` then waited for the thread until the build
ended (up to ``build_timeout_s``, 30 min); SIGTERM ended the process at once with its build, the
build's ``RUN`` step and its scratch left behind. Now both kill the build and exit (130 / 143) with
the line saying OUT keeps what is done; nothing is left running and no OUT or run folder is made.
The fake podman and the probes are ``tests/cli/test_interrupt_builds.py``'s.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli.test_interrupt_builds import WAIT_S, Builds, fake_builds, rollout_config

SIGNALS = pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])


@pytest.fixture
def builds(tmp_path: Path) -> Iterator[Builds]:
    with fake_builds(tmp_path) as made:
        yield made


RECORD = {
    "repo": "o/p",
    "base_commit": "0" * 40,
    "problem_statement": "What is 6*7?",
    "instance_id": "o__p.1",
    "answer": "42",
}


def calibrate(tmp_path, builds: Builds):
    config = rollout_config(tmp_path, builds)
    (tmp_path / "in.jsonl").write_text(json.dumps(RECORD) + "\n")
    out, run_dir = tmp_path / "out.jsonl", tmp_path / "run"
    args = ["data", "calibrate", str(tmp_path / "in.jsonl"), str(out), "--config", str(config), "--k", "1"]
    return builds.start([*args, "--run-dir", str(run_dir)], tmp_path), out, run_dir


@SIGNALS
def test_a_signal_during_calibrates_preflight_build_kills_it(tmp_path, builds, signum):
    process, out, run_dir = calibrate(tmp_path, builds)
    status = builds.stop_while_building(process, signum)
    err = builds.stderr(process, tmp_path)
    assert status == 128 + signum, err[-2000:]
    assert f"interrupted; OUT keeps what is done, run the same command to go on: {out}" in err, err[-2000:]
    assert "Traceback" not in err
    assert not out.exists() and not run_dir.exists()
    builds.assert_nothing_left()


def test_a_failed_preflight_build_ends_calibrate_with_nothing_left(tmp_path, builds):
    # The control: not interrupted, the build fails on its own; the same probes see a clean end.
    (builds.dir / "fail").touch()
    process, out, run_dir = calibrate(tmp_path, builds)
    status = process.wait(timeout=WAIT_S)
    err = builds.stderr(process, tmp_path)
    assert status == 2, err[-2000:]
    assert "building image localhost/harnessrl/spin" in err and "no such base" in err, err[-2000:]
    assert not out.exists() and not run_dir.exists()
    builds.assert_nothing_left()
