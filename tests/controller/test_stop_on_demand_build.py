"""A rollout's image built on demand (its task names an environment not built yet) stops with the
controller that builds it, and only that build: two controllers in one process, each building a
rollout's image; the one that shuts down kills its build and requeues its rollout, while the other's
build goes on and succeeds. The real ``harnessrl controller`` stopped by SIGTERM during two such
builds exits 0 (a service) with no build process left and both rollouts requeued.

Before, a controller's shutdown cancelled the rollout's task but left its worker thread building (up
to ``build_timeout_s``, 30 min): the build ran on after ``shutdown`` returned, and
``asyncio.run`` waited for it on the way out.

No image is built: the fake podman of ``tests/environments/test_stop_one_build.py`` (a build runs,
with a "step" in a session of its own, until the test releases it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.environments.test_stop_one_build import Fakes, fakes, wait_until
from tests.fakes.processes import WAIT_S, wait_for

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.local import LocalRunner
from harnessrl.environments.config import EnvironmentConfig
from harnessrl.schemas import RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

__all__ = ["fakes"]  # the fixture, imported to be used here


def make_controller(fakes: Fakes, db: Path, run_id: str) -> Controller:
    config = EnvironmentConfig(
        images={"one": fakes.recipe("one"), "two": fakes.recipe("two")}, store=str(fakes.store_path)
    )
    return Controller(
        SQLiteStore(db),
        LocalRunner(bridge_path=None),
        gateway=GatewayEndpoint("127.0.0.1", 9),
        harness=HarnessSpec(command=["true"], environment=config),
        evaluator=build_evaluator({"type": "command", "command": ["true"]}),
        run_dir=fakes.tmp / f"run-{run_id}",
        config=ControllerConfig(max_infra_retries=0, poll_interval_s=0.1),
        run_id=run_id,
    )


def test_a_controller_shutting_down_kills_its_rollouts_build_and_not_anothers(fakes: Fakes):
    db = fakes.tmp / "db.sqlite"
    store = SQLiteStore(db)
    first = store.create_rollout(task={"environment": "one"}, run_id="run-1").rollout_id
    second = store.create_rollout(task={"environment": "two"}, run_id="run-2").rollout_id
    stopping, going = make_controller(fakes, db, "run-1"), make_controller(fakes, db, "run-2")

    async def go() -> None:
        stop_one, stop_two = asyncio.Event(), asyncio.Event()
        runs = [
            asyncio.create_task(stopping.run_forever(stop_one)),
            asyncio.create_task(going.run_forever(stop_two)),
        ]
        try:
            await wait_until("both images to build", lambda: fakes.building("one") and fakes.building("two"))
            stop_one.set()
            await runs[0]  # its shutdown: the attempt cancelled, the rollout requeued
            wait_for("the stopped controller's build to be gone", lambda: fakes.running("one") == [])
            assert store.get_rollout(first).status is RolloutStatus.QUEUED
            # The control: the other controller's build, in the same process, runs on.
            assert fakes.building("two") and store.get_rollout(second).status is RolloutStatus.RUNNING
            fakes.release("two")
            await wait_until("the other build to finish", lambda: fakes.running("two") == [])
            await wait_until(
                "the other rollout's attempt to end",
                lambda: store.get_rollout(second).status is not RolloutStatus.RUNNING,
            )
        finally:
            fakes.release("one")
            fakes.release("two")
            stop_one.set()
            stop_two.set()
            await asyncio.gather(*runs, return_exceptions=True)

    try:
        asyncio.run(go())
        assert (fakes.dir / "built-two").exists() and not (fakes.dir / "built-one").exists()
        assert sorted(fakes.builds()) == ["one", "two"]
        # Its image built, the attempt went on to mount it (which the fake podman cannot do).
        assert "podman image mount" in (store.get_rollout(second).error or "")
        assert fakes.scratch() == []
    finally:
        for made in (stopping, going):
            made.store.close()
        store.close()


def test_sigterm_stops_harnessrl_controller_building_two_rollouts_images(fakes: Fakes):
    # A guard for the command as a whole (it kills every build of the process at a stop): with each
    # rollout's build now stopped by its own task, SIGTERM still ends it at once, exit 0, nothing left.
    db = fakes.tmp / "shared.db"
    store = SQLiteStore(db)
    try:
        for name in ("one", "two"):
            store.create_rollout(task={"prompt": "hi", "environment": name}, rollout_id=f"r-{name}")
    finally:
        store.close()
    section = (
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n\n'
        f"[harness.environment]\nstore = {json.dumps(str(fakes.store_path))}\n"
        f"images.one = {{ containerfile = {json.dumps(fakes.recipe('one').containerfile)} }}\n"
        f"images.two = {{ containerfile = {json.dumps(fakes.recipe('two').containerfile)} }}\n"
        '\n[evaluator]\ntype = "command"\ncommand = ["true"]\n'
    )
    (fakes.tmp / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = fakes.tmp / "rollout.toml"
    config.write_text(f'[engine]\nmodel = "scripted:{fakes.tmp / "replies.json"}"\n\n' + section)
    err = fakes.tmp / "err.txt"
    with err.open("w") as err_file:
        controller = subprocess.Popen(
            [
                sys.executable, "-m", "harnessrl", "controller", "--config", str(config),
                "--store", str(db), "--gateway-url", "http://127.0.0.1:9999",
                "--run-dir", str(fakes.tmp / "ctl"),
            ],
            cwd=fakes.tmp, env={**os.environ, **fakes.env},
            stdout=subprocess.DEVNULL, stderr=err_file, text=True,
        )  # fmt: skip
    fakes.started.append(controller)

    def both_building() -> bool:
        if controller.poll() is not None:
            raise AssertionError(f"the controller ended (exit {controller.returncode}): {err.read_text()}")
        return fakes.building("one") and fakes.building("two")

    wait_for("both rollouts' images to build", both_building)
    controller.send_signal(signal.SIGTERM)
    try:
        status = controller.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGTERM did not stop the controller") from None
    assert status == 0, err.read_text()[-2000:]
    wait_for("the builds' processes to be gone", lambda: fakes.running("one") + fakes.running("two") == [])
    assert fakes.scratch() == []
    store = SQLiteStore(db)
    try:
        assert {store.get_rollout(r).status for r in ("r-one", "r-two")} == {RolloutStatus.QUEUED}
    finally:
        store.close()
