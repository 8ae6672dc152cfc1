"""What an attempt leaves on disk, and whose fault its workspace is: a tree the policy nested past the
host's ``PATH_MAX`` is the policy's outcome (never an infrastructure failure), and
``keep_workspaces = false`` removes the harness's ``$HOME`` with its workspace. Real sandboxed
harnesses, the real command evaluator."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.local import LocalRunner
from harnessrl.schemas import Outcome, Rollout, RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def run_one(tmp_path: Path, command: list[str], **config) -> Rollout:
    """One rollout of ``command`` in the bwrap sandbox, scored by a command scorer that always passes."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    controller = Controller(
        store,
        LocalRunner(bridge_path=None),  # these harnesses make no model calls
        gateway=GatewayEndpoint("127.0.0.1", 9),
        harness=HarnessSpec(command=command, timeout_s=60, sandbox="bwrap"),
        evaluator=build_evaluator({"type": "command", "command": ["true"]}),
        run_dir=tmp_path / "run",
        config=ControllerConfig(poll_interval_s=0.1, **config),
    )

    async def go() -> Rollout:
        [rollout] = await controller.run_until_done([rid], timeout_s=120)
        await controller.shutdown()
        return rollout

    rollout = asyncio.run(go())
    store.close()
    return rollout


def nesting_harness(depth: int) -> list[str]:
    """A harness that nests ``depth`` folders of 200 characters in its workspace (its own path in the
    sandbox is short, so it can; the host's path to the same tree is longer)."""
    code = (
        "import os\n"
        f"for _ in range({depth}):\n"
        "    os.mkdir('a' * 200)\n"
        "    os.chdir('a' * 200)\n"
        "open('answer.txt', 'w').write('42')\n"
    )
    return ["python3", "-c", code]


def test_a_tree_nested_past_path_max_is_the_policys_outcome(tmp_path):
    """25 x 201 characters pass PATH_MAX on the host: the evaluator's copy used to raise "File name
    too long", which the controller counted as infrastructure (retried, then ``infra_failure``, left
    out of the baseline) — a way for a failing policy to have its rollout not count."""
    rollout = run_one(tmp_path, nesting_harness(25), max_infra_retries=1)
    assert rollout.status is RolloutStatus.FINISHED, rollout.error
    assert rollout.outcome is Outcome.SUCCESS and rollout.attempt == 0  # judged, never retried
    assert "special_files_skipped" in rollout.flags  # what the copy left out is said
    assert rollout.metadata["evaluation"]["workspace_copy"]["skipped"]
    assert "too long" in " ".join(rollout.metadata["evaluation"]["workspace_copy"]["unreadable"])  # and why


def test_a_tree_within_path_max_is_copied_and_scored(tmp_path):
    """Control: five folders deep, the same harness is scored with nothing left out."""
    rollout = run_one(tmp_path, nesting_harness(5), max_infra_retries=1)
    assert rollout.status is RolloutStatus.FINISHED and rollout.outcome is Outcome.SUCCESS
    assert rollout.flags == [] and rollout.attempt == 0
    assert rollout.metadata["evaluation"]["workspace_copy"]["skipped"] == []
    assert rollout.metadata["evaluation"]["workspace_copy"]["unreadable"] == []


HOME_WRITER = ["sh", "-c", 'head -c 4000000 /dev/zero > "$HOME/blob" && echo done > answer.txt && echo ok']


def test_keep_workspaces_false_removes_the_home_too(tmp_path):
    """The harness's ``$HOME`` is as much its scratch as the workspace: ``keep_workspaces = false`` used
    to remove only the workspace, and every attempt's home (here a 4 MB blob) stayed on disk."""
    rollout = run_one(tmp_path, HOME_WRITER, keep_workspaces=False)
    assert rollout.outcome is Outcome.SUCCESS
    attempt = Path(rollout.metadata["log_dir"])
    assert not (attempt / "workspace").exists()
    assert not (attempt / "home").exists()
    assert (attempt / "stdout.log").read_text().strip() == "ok"  # the logs are kept


def test_keep_workspaces_true_keeps_the_home(tmp_path):
    """Control: by default both stay for inspection, blob included."""
    rollout = run_one(tmp_path, HOME_WRITER)
    attempt = Path(rollout.metadata["log_dir"])
    assert (attempt / "home" / "blob").stat().st_size == 4_000_000
    assert (attempt / "workspace" / "answer.txt").read_text() == "done\n"


def test_a_relative_run_dir_scores_the_workspace_the_harness_wrote(tmp_path, monkeypatch):
    """``harnessrl data calibrate --run-dir runs/teacher`` (a relative folder): the scorer's
    ``{workspace}`` was that relative path, read from the scorer's own folder, and every file the
    harness wrote was missing: every rollout scored 0. The control is the same rollout's file gone."""
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore(tmp_path / "db.sqlite")

    def scored(harness: str) -> Rollout:
        rid = store.create_rollout(task={}).rollout_id
        controller = Controller(
            store,
            LocalRunner(bridge_path=None),
            gateway=GatewayEndpoint("127.0.0.1", 9),
            harness=HarnessSpec(command=["sh", "-c", harness], timeout_s=60, sandbox="bwrap"),
            evaluator=build_evaluator(
                {"type": "command", "command": ["sh", "-c", "test -f {workspace}/a.txt"]}
            ),
            run_dir=Path("run"),  # relative, as a command line gives it
            config=ControllerConfig(poll_interval_s=0.1),
        )

        async def go() -> Rollout:
            [rollout] = await controller.run_until_done([rid], timeout_s=120)
            await controller.shutdown()
            return rollout

        return asyncio.run(go())

    assert scored("echo done > a.txt").reward == 1.0
    assert scored("true").reward == 0.0  # the control: no file, no reward
