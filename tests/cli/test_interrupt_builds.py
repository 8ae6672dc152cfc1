"""Ctrl-C (SIGINT) and SIGTERM while a command builds a task's image, through the real command in a
real process: ``harnessrl train`` and ``harnessrl rollout`` (their pre-flight builds, in a worker
thread), ``harnessrl images build`` (in the main thread) and ``harnessrl controller`` (a rollout's
image built on demand).

A worker thread only cancelled went on building, and ``asyncio.run``'s shutdown waited for it up to
``build_timeout_s`` (30 min): one Ctrl-C did nothing visible; the controller ignored every further
Ctrl-C too. SIGTERM ended ``images build`` at once, its build and ``RUN`` step left running and its
scratch left in the store. Now each command exits promptly with 128 + the signal (the controller,
a service, with 0), says so, and leaves no build process, no scratch and no half-made run folder.

No image is built: ``HARNESSRL_PODMAN`` is a shell script whose build starts a "step" in a session
of its own (as runc does) and then runs on until killed. Every wait is for a state, with a timeout
that only ends a hung test.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.fakes.processes import WAIT_S, processes_running, wait_for

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny"
HARNESSRL = [sys.executable, "-m", "harnessrl"]
IMAGE_ID = "a" * 64

FAKE_PODMAN = """#!/bin/sh
case "$1" in
  image)
    case "$2" in
      exists) case "$3" in *harnessrl*) [ -e "$FAKE_DIR/built" ]; exit $? ;; *) exit 0 ;; esac ;;
      inspect) echo '[{"Id": "FAKE_ID"}]' ;;
      *) echo '[]' ;;
    esac ;;
  build)
    if [ -e "$FAKE_DIR/fail" ]; then echo "no such base" >&2; exit 125; fi
    setsid sh -c "while :; do sleep 1; done # step-$FAKE_MARK" </dev/null >/dev/null 2>&1 &
    echo started
    while :; do sleep 1; done ;;
  *) echo '[]' ;;
esac
""".replace("FAKE_ID", IMAGE_ID)


class Builds:
    """A fake podman in ``tmp_path``, a store, a Containerfile and an environment section naming them."""

    def __init__(self, tmp_path: Path):
        self.dir = tmp_path / "fake"
        self.dir.mkdir()
        self.mark = secrets.token_hex(6)
        self.podman = self.dir / "podman"
        self.podman.write_text(FAKE_PODMAN)
        self.podman.chmod(0o755)
        self.store = tmp_path / "store"
        context = tmp_path / "ctx"
        context.mkdir()
        (context / "Containerfile").write_text("FROM localhost/base:1\nRUN true\n")
        self.section = (
            '\n[harness.environment]\ndefault = "spin"\n'
            f"store = {json.dumps(str(self.store))}\n"
            f"images.spin = {{ containerfile = {json.dumps(str(context / 'Containerfile'))} }}\n"
        )
        self.env = {
            **os.environ,
            "HARNESSRL_PODMAN": str(self.podman),
            "FAKE_DIR": str(self.dir),
            "FAKE_MARK": self.mark,
        }
        self.started: list[subprocess.Popen[str]] = []

    def start(self, args: list[str], cwd: Path) -> subprocess.Popen[str]:
        out = (cwd / f"out-{len(self.started)}.txt").open("w")
        err = (cwd / f"err-{len(self.started)}.txt").open("w")
        process = subprocess.Popen(
            [*HARNESSRL, *args], cwd=cwd, env=self.env, stdout=out, stderr=err, text=True
        )
        self.started.append(process)
        return process

    def stderr(self, process: subprocess.Popen[str], cwd: Path) -> str:
        return (cwd / f"err-{self.started.index(process)}.txt").read_text()

    def running(self) -> list[int]:
        """The fake's processes still running: its client (the script's path in argv) and its step
        (the mark in argv)."""
        return processes_running(self.mark, str(self.podman))

    def building(self, process: subprocess.Popen[str]) -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the command ended before its build ran (exit {process.returncode})")
        logs = list((self.store / "logs").glob("*.log")) if (self.store / "logs").is_dir() else []
        return any("started" in log.read_text() for log in logs) and len(self.running()) >= 2

    def scratch(self) -> list[str]:
        tmp = self.store / "tmp"
        return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []

    def stop_while_building(self, process: subprocess.Popen[str], signum: int) -> int:
        """Wait for the build and its step to run, send ``signum``, return the exit status."""
        wait_for("the build and its step to run", lambda: self.building(process))
        process.send_signal(signum)
        try:
            return process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{signal.Signals(signum).name} did not stop the command") from None

    def assert_nothing_left(self) -> None:
        wait_for("the build's processes to be gone", lambda: self.running() == [])
        assert self.scratch() == []


@pytest.fixture
def builds(tmp_path: Path) -> Iterator[Builds]:
    with fake_builds(tmp_path) as made:
        yield made


@contextlib.contextmanager
def fake_builds(tmp_path: Path) -> Iterator[Builds]:
    made = Builds(tmp_path)
    try:
        yield made
    finally:
        for process in made.started:
            if process.poll() is None:
                process.kill()
                process.wait()
        for pid in made.running():  # the old behaviour: never leave a spinning process behind
            os.kill(pid, signal.SIGKILL)


SIGNALS = pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])


def train_project(tmp_path: Path, builds: Builds) -> Path:
    shutil.copy(TINY / "agent.py", tmp_path / "agent.py")
    (tmp_path / "train.toml").write_text((TINY / "train.toml").read_text() + builds.section)
    return tmp_path / "train.toml"


def rollout_config(tmp_path: Path, builds: Builds) -> Path:
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n'
        + builds.section
        + '\n[evaluator]\ntype = "exact_match"\n'
    )
    return config


@SIGNALS
def test_a_signal_during_trains_preflight_build_kills_it_and_stops_the_run(tmp_path, builds, signum):
    config = train_project(tmp_path, builds)
    run_dir = tmp_path / "runs" / "tiny-vowels"
    train = builds.start(["train", str(config), "--set", "trainer.steps=1"], tmp_path)
    status = builds.stop_while_building(train, signum)
    err = builds.stderr(train, tmp_path)
    assert status == 128 + signum, err[-2000:]
    name = signal.Signals(signum).name
    assert f"{name}: run stopped while starting; nothing was kept in {run_dir}" in err, err[-2000:]
    assert "Traceback" not in err
    assert not run_dir.exists()  # a new run stopped before its first step: nothing half-created
    builds.assert_nothing_left()


def test_a_failed_preflight_build_ends_train_with_nothing_left(tmp_path, builds):
    # The control: not interrupted, the pre-flight's build fails on its own; the same probes see a
    # clean end (exit 2 naming the build, no folder, no process, no scratch).
    (builds.dir / "fail").touch()
    config = train_project(tmp_path, builds)
    train = builds.start(["train", str(config), "--set", "trainer.steps=1"], tmp_path)
    status = train.wait(timeout=WAIT_S)
    err = builds.stderr(train, tmp_path)
    assert status == 2, err[-2000:]
    assert "building image localhost/harnessrl/spin" in err and "no such base" in err, err[-2000:]
    assert not (tmp_path / "runs" / "tiny-vowels").exists()
    builds.assert_nothing_left()


@SIGNALS
def test_a_signal_during_rollouts_preflight_build_kills_it(tmp_path, builds, signum):
    config = rollout_config(tmp_path, builds)
    run_dir = tmp_path / "run"
    task = json.dumps({"prompt": "hi", "hidden": {"answer": "x"}})
    rollout = builds.start(
        ["rollout", "--config", str(config), "--task", task, "--run-dir", str(run_dir)], tmp_path
    )
    status = builds.stop_while_building(rollout, signum)
    err = builds.stderr(rollout, tmp_path)
    assert status == 128 + signum, err[-2000:]
    assert not run_dir.exists()  # the stack (store, gateway) had not started: nothing made
    builds.assert_nothing_left()


@SIGNALS
def test_a_signal_during_images_build_kills_the_build(tmp_path, builds, signum):
    config = rollout_config(tmp_path, builds)
    images = builds.start(["images", "build", str(config)], tmp_path)
    status = builds.stop_while_building(images, signum)
    err = builds.stderr(images, tmp_path)
    assert status == 128 + signum, err[-2000:]
    if signum == signal.SIGTERM:
        assert "harnessrl images: stopped by SIGTERM (the build was killed)" in err, err[-2000:]
    builds.assert_nothing_left()


@SIGNALS
def test_a_signal_stops_a_controller_building_a_rollouts_image(tmp_path, builds, signum):
    from harnessrl.store import open_store

    config = rollout_config(tmp_path, builds)
    db = tmp_path / "shared.db"
    store = open_store(str(db))
    try:
        store.create_rollout(task={"prompt": "hi", "hidden": {"answer": "x"}}, rollout_id="r-1")
    finally:
        store.close()
    controller = builds.start(
        [
            "controller", "--config", str(config), "--store", str(db),
            "--gateway-url", "http://127.0.0.1:9999", "--run-dir", str(tmp_path / "ctl"),
        ],
        tmp_path,
    )  # fmt: skip
    status = builds.stop_while_building(controller, signum)
    assert status == 0, builds.stderr(controller, tmp_path)[-2000:]
    builds.assert_nothing_left()
    store = open_store(str(db))
    try:
        assert store.get_rollout("r-1").status.value == "queued"  # requeued for another controller
    finally:
        store.close()
