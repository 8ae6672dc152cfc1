"""The real ``harnessrl rollout``, whose pre-flight waits for another process's build of the same image
(that process holds the image's build lock), stopped by SIGTERM: it exits 143 at once with nothing
made, and the other process's build runs on and succeeds.

The wait was a blocking ``flock``: the command could not stop until the other process's build ended
(up to ``build_timeout_s``, 30 min), the second SIGTERM aside.

No image is built: the fake podman of ``test_stop_one_build.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from tests.environments.test_stop_one_build import Fakes, fakes
from tests.fakes.processes import WAIT_S, wait_for

__all__ = ["fakes"]  # the fixture, imported to be used here


def test_sigterm_stops_rollouts_preflight_waiting_for_another_processs_build(fakes: Fakes):
    containerfile = fakes.recipe("one").containerfile
    (fakes.tmp / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = fakes.tmp / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{fakes.tmp / "replies.json"}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n\n'
        f'[harness.environment]\ndefault = "one"\nstore = {json.dumps(str(fakes.store_path))}\n'
        f"images.one = {{ containerfile = {json.dumps(containerfile)} }}\n"
        '\n[evaluator]\ntype = "exact_match"\n'
    )
    holder = fakes.ensure_elsewhere("one")
    wait_for("the other process's build to run", lambda: fakes.building("one"))
    run_dir = fakes.tmp / "run"
    err = fakes.tmp / "err.txt"
    task = json.dumps({"prompt": "hi", "hidden": {"answer": "x"}})
    with err.open("w") as err_file:
        rollout = subprocess.Popen(
            [
                sys.executable, "-m", "harnessrl", "rollout", "--config", str(config),
                "--task", task, "--run-dir", str(run_dir),
            ],
            cwd=fakes.tmp, env={**os.environ, **fakes.env},
            stdout=subprocess.DEVNULL, stderr=err_file, text=True,
        )  # fmt: skip
    fakes.started.append(rollout)

    def at_the_lock() -> bool:
        if rollout.poll() is not None:
            raise AssertionError(f"the rollout ended (exit {rollout.returncode}): {err.read_text()}")
        # "Is it built?" asked by the holder (before and under its lock), then by the rollout's
        # pre-flight, which then waits for the lock.
        return fakes.asked() >= 3

    wait_for("the rollout's pre-flight to wait for the build lock", at_the_lock)
    rollout.send_signal(signal.SIGTERM)
    try:
        status = rollout.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGTERM did not stop a pre-flight waiting for a build lock") from None
    finally:
        # The holder, untouched meanwhile (it still builds), is let finish.
        still_building = fakes.building("one") and holder.poll() is None
        fakes.release("one")
    assert status == 128 + signal.SIGTERM, err.read_text()[-2000:]
    assert "Traceback" not in err.read_text()
    assert not run_dir.exists()  # stopped before the stack started: nothing made
    assert still_building
    out, holder_err = holder.communicate(timeout=WAIT_S)
    assert holder.returncode == 0 and "built=True" in out, holder_err[-2000:]
    assert fakes.builds() == ["one"]  # built once, by the holder
    assert fakes.scratch() == []
