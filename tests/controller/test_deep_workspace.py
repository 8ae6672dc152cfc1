"""What the policy's workspace does to the controller after the harness ends. A harness that nests
3,000 folders (past Python's recursion limit: 3.11's ``os.walk`` and ``shutil.rmtree`` recurse) made
the evaluator crash ("evaluator crashed: RecursionError") and the scratch removal fail ("controller
error: RecursionError"): its 0 became an infrastructure failure, out of its group's baseline. Hard
links were free against ``limits.disk_mb`` (counted once), and the scratch was removed before the
verdict was recorded: a million links kept a finished attempt from finishing for seconds. Real
bubblewrap sandboxes, the real controller and command evaluator; each attack beside its control."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from harnessrl.controller import controller as controller_module
from harnessrl.controller.base import HarnessSpec, ResourceLimits
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.local import LocalRunner
from harnessrl.schemas import Outcome, Rollout, RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")

DEEP = 3000
SHALLOW = 100


@pytest.fixture(autouse=True)
def _own_temp(tmp_path, monkeypatch):
    """The evaluator's scratch under ``tmp_path``, and every deep tree removed with ``rm`` (which does
    not recurse) afterwards: pytest's own ``rmtree`` of old temporary folders recurses."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    yield
    subprocess.run(["rm", "-rf", "--", str(tmp_path)], check=False)


def run_one(
    tmp_path: Path,
    code: str,
    *,
    limits: ResourceLimits | None = None,
    on_attempt_done: Callable[[str], None] | None = None,
    **config,
) -> tuple[Rollout, SQLiteStore]:
    """One rollout of the Python ``code`` as its harness in the bwrap sandbox, scored by a scorer that
    fails (reward 0: what the policy earned), no retries of infrastructure failures."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    rid = store.create_rollout(task={}).rollout_id
    controller = Controller(
        store,
        LocalRunner(bridge_path=None),  # these harnesses make no model calls
        gateway=GatewayEndpoint("127.0.0.1", 9),
        harness=HarnessSpec(
            command=["python3", "-c", code],
            timeout_s=120,
            sandbox="bwrap",
            limits=limits or ResourceLimits(),
        ),
        evaluator=build_evaluator({"type": "command", "command": ["sh", "-c", "test -f {workspace}/x"]}),
        run_dir=tmp_path / "run",
        config=ControllerConfig(poll_interval_s=0.1, max_infra_retries=0, **config),
    )
    controller.on_attempt_done = on_attempt_done

    async def go() -> Rollout:
        [rollout] = await controller.run_until_done([rid], timeout_s=300)
        await controller.shutdown()
        return rollout

    return asyncio.run(go()), store


def nesting(depth: int, *, home: bool = False) -> str:
    """Harness code nesting ``depth`` folders in its workspace, and in its ``$HOME`` too if ``home``
    (``openat`` down, as the attack)."""
    folders = "['.', os.environ['HOME']]" if home else "['.']"
    return (
        "import os\n"
        f"for top in {folders}:\n"
        "    fd = os.open(top, os.O_RDONLY)\n"
        f"    for _ in range({depth}):\n"
        "        os.mkdir('d', dir_fd=fd)\n"
        "        fd, up = os.open('d', os.O_RDONLY, dir_fd=fd), fd\n"
        "        os.close(up)\n"
        "print('nested')\n"
    )


@pytest.mark.parametrize("depth", [DEEP, SHALLOW])
def test_a_deep_workspace_is_scored_as_the_policys_0(tmp_path, depth):
    rollout, store = run_one(tmp_path, nesting(depth))
    store.close()
    assert rollout.status is RolloutStatus.FINISHED, rollout.error
    assert rollout.outcome is Outcome.SUCCESS and rollout.reward == 0.0 and rollout.attempt == 0
    if depth == DEEP:  # copied to the host's PATH_MAX; what lies past it said, as the policy's
        assert "special_files_skipped" in rollout.flags
    else:
        assert rollout.flags == []
    left = [name for name in os.listdir(tmp_path / "tmp") if name.startswith("harnessrl-eval-")]
    assert left == []  # the evaluation's scratch is gone


@pytest.mark.parametrize("depth", [DEEP, SHALLOW])
def test_a_deep_workspace_and_home_are_discarded(tmp_path, depth):
    """``keep_workspaces = false``: the removal of both raised ``RecursionError`` before the finish
    (the rollout failed as a controller error), and again after it (the task died, scratch left)."""
    rollout, store = run_one(tmp_path, nesting(depth, home=True), keep_workspaces=False)
    store.close()
    assert rollout.status is RolloutStatus.FINISHED, rollout.error
    assert rollout.reward == 0.0 and rollout.attempt == 0
    attempt = Path(rollout.metadata["log_dir"])
    assert not (attempt / "workspace").exists() and not (attempt / "home").exists()
    assert (attempt / "stdout.log").read_text().strip() == "nested"


def test_the_verdict_is_recorded_before_the_scratch_is_removed(tmp_path, monkeypatch):
    """What the store says each time the controller removes an attempt's scratch: the removal before
    the harness starts sees it running; the one after the harness must see it finished, and the
    trainer told (removing a tree as big as the policy made it took as long, the rollout unfinished)."""
    seen: list[str] = []
    discard = controller_module.discard_attempt_scratch

    def spy(attempt_dir: Path) -> None:
        [rollout] = SQLiteStore(tmp_path / "db.sqlite").list_rollouts()
        seen.append(rollout.status.value)
        discard(attempt_dir)

    monkeypatch.setattr(controller_module, "discard_attempt_scratch", spy)
    rollout, store = run_one(
        tmp_path,
        "open('answer.txt', 'w').write('1')",
        keep_workspaces=False,
        on_attempt_done=lambda _rid: seen.append("told"),
    )
    store.close()
    assert rollout.status is RolloutStatus.FINISHED, rollout.error
    assert seen[:3] == ["running", "told", "finished"]
    assert not (Path(rollout.metadata["log_dir"]) / "workspace").exists()


def linking(links: int) -> str:
    return f"import os\nopen('f', 'w').close()\nfor i in range({links}):\n    os.link('f', f'l{{i}}')\n"


@pytest.mark.parametrize(("links", "over"), [(3000, True), (300, False)])
def test_hard_links_count_against_disk_mb(tmp_path, links, over):
    """``disk_mb = 4`` holds 1,024 entries of ``ENTRY_BYTES``: 3,000 names of one empty file are past
    it (counted as one file, ~500 million fit 10 GiB); 300 are not."""
    rollout, store = run_one(tmp_path, linking(links), limits=ResourceLimits(disk_mb=4))
    store.close()
    assert rollout.status is RolloutStatus.FINISHED, rollout.error
    assert rollout.metadata["exit"]["kind"] == ("resource_limit" if over else "exited")
    assert rollout.outcome is (Outcome.POLICY_FAILURE if over else Outcome.SUCCESS)
