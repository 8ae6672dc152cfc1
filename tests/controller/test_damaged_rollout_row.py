"""A rollout row damaged while its harness runs (a disk or a bad writer: its ``task`` or ``metadata``
no longer decodes). No verdict fits in such a row: the finish, a retry and the requeue of a shutdown
each read it and raised, the attempt was remembered to be recorded "at the next poll", and that
record raised at every poll before the claim: the rollout stayed ``running`` for ever and the
controller claimed nothing more. Now the controller ends it ``failed`` (``infra_failure``) by the one
write that needs none of its damaged columns, goes on claiming, and the trainer's book leaves it out
of its group (``rollouts/row_unreadable``). A real controller, real harness processes (which damage
their own row in the real SQLite store), the real trainer book, beside an undamaged control rollout.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.local import LocalRunner
from harnessrl.schemas import RolloutStatus, Task
from harnessrl.store.damage import RolloutUnreadable
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.trainer.config import TrainerSection
from harnessrl.trainer.fleet import RolloutBook
from harnessrl.trainer.schedule import TaskSchedule
from harnessrl.trainer.step import prepare_step

RUN = "run"
# Only ends a hung test: every wait below is for a state.
PATIENCE_S = 60
ENDED = ("finished", "failed", "cancelled")


def harness(db: Path, column: str, damaged: str, *, then_wait: bool = False) -> list[str]:
    """A harness that damages ``column`` of its own row if it is rollout ``damaged`` (as a disk might
    while it runs), then exits 0, or with ``then_wait`` blocks until it is killed."""
    script = (
        "import os, sqlite3, sys, time\n"
        "rollout = os.environ['HARNESSRL_ROLLOUT_ID']\n"
        f"if rollout == {damaged!r}:\n"
        f"    with sqlite3.connect({str(db)!r}) as conn:\n"
        f"        conn.execute(\"UPDATE rollouts SET {column} = '{{damaged' WHERE rollout_id = ?\", (rollout,))\n"
        f"    while {then_wait!r}:\n"
        "        time.sleep(1)\n"
    )
    return [sys.executable, "-c", script]


def make_controller(
    store: SQLiteStore, tmp_path: Path, command: list[str], poll_s: float = 0.05
) -> Controller:
    return Controller(
        store,
        LocalRunner(bridge_path=None),  # these harnesses make no model calls
        gateway=GatewayEndpoint("127.0.0.1", 9),
        harness=HarnessSpec(command=command, timeout_s=120, sandbox="none"),
        evaluator=build_evaluator({"type": "command", "command": ["true"]}),
        run_dir=tmp_path / "run",
        config=ControllerConfig(poll_interval_s=poll_s, max_infra_retries=2),
        run_id=RUN,
    )


def row(db: Path, rollout_id: str) -> dict[str, object]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        found = conn.execute(
            "SELECT status, outcome, error, worker_id, task, metadata FROM rollouts WHERE rollout_id = ?",
            (rollout_id,),
        ).fetchone()
    return dict(found)


async def wait_for(predicate, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + PATIENCE_S
    while not predicate():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("column", ["task", "metadata"])
def test_a_row_damaged_while_its_harness_runs_ends_failed_and_is_left_out(tmp_path, column):
    db = tmp_path / "store.db"
    store = SQLiteStore(db)
    store.create_run(RUN)
    plan = TaskSchedule([Task(task_id="t0", split="train", data={"prompt": "p"})], 2, seed=0).group(0)
    book = RolloutBook(store, RUN, poll_s=0.05)
    asyncio.run(book.submit([plan]))
    broken, control = plan.rollout_ids
    controller = make_controller(store, tmp_path, harness(db, column, broken))
    controller.on_attempt_done = book.notify

    async def go():
        stop = asyncio.Event()
        loop = asyncio.create_task(controller.run_forever(stop))
        try:
            [group] = await asyncio.wait_for(book.completed(1), PATIENCE_S)
            await wait_for(lambda: row(db, broken)["status"] in ENDED, "the damaged rollout to end")
            # the controller goes on claiming: a rollout created after the damage is run and scored
            later = store.create_rollout(rollout_id="later", run_id=RUN, task={"prompt": "p"})
            await wait_for(lambda: row(db, later.rollout_id)["status"] == "finished", "a later rollout")
            return group
        finally:
            stop.set()
            await loop

    group = asyncio.run(go())
    damaged = row(db, broken)
    assert damaged["status"] == "failed" and damaged["outcome"] == "infra_failure"
    assert damaged["worker_id"] is None
    assert f"rollout {broken}" in str(damaged["error"]) and column in str(damaged["error"])
    assert damaged[column] == "{damaged"  # ended without writing over the damage
    # the control rollout beside it was scored as usual
    assert store.get_rollout(control).status.value == "finished" and store.get_rollout(control).reward == 1.0
    # the trainer's book leaves it out, and the step counts it
    assert [r.rollout_id for r in group.rollouts] == [control]
    assert set(group.rows_unreadable) == {broken}
    batch = prepare_step([group], 0, TrainerSection(), AlgorithmConfig())
    assert batch.metrics["rollouts/row_unreadable"] == 1 and batch.metrics["rollouts/total"] == 1
    assert store.count_rollouts(run_id=RUN, status=RolloutStatus.RUNNING) == 0
    book.requeue_running("run over")  # nothing of the run is left running
    assert row(db, broken)["status"] == "failed"
    store.close()


def test_a_harness_still_running_on_a_damaged_row_is_stopped_and_the_rollout_failed(tmp_path):
    """The harness does not exit after its row was damaged (its model calls refused, it waits): it
    ran on until its timeout, and the attempt then could not be ended. Now the controller's watch
    stops it and the rollout ends failed, while the controller runs on."""
    db = tmp_path / "store.db"
    store = SQLiteStore(db)
    store.create_run(RUN)
    for rollout_id in ("broken", "control"):
        store.create_rollout(rollout_id=rollout_id, run_id=RUN, task={"prompt": "p"})
    controller = make_controller(store, tmp_path, harness(db, "task", "broken", then_wait=True))

    async def go():
        stop = asyncio.Event()
        loop = asyncio.create_task(controller.run_forever(stop))
        try:
            await wait_for(lambda: row(db, "broken")["status"] in ENDED, "the damaged rollout to end")
            await wait_for(lambda: row(db, "control")["status"] == "finished", "the control rollout")
        finally:
            stop.set()
            await loop

    asyncio.run(go())
    damaged = row(db, "broken")
    assert damaged["status"] == "failed" and damaged["outcome"] == "infra_failure", damaged
    assert "rollout broken" in str(damaged["error"]) and "task" in str(damaged["error"])
    assert store.get_rollout("control").reward == 1.0
    store.close()


def test_a_damaged_row_whose_controller_shuts_down_does_not_stay_running(tmp_path):
    """A shutdown requeues the attempts it kills; the requeue of a damaged row raised (suppressed),
    and the row stayed ``running`` with no worker ever to run it: now it ends failed. (The watch
    that would stop the harness first polls once an hour here: the shutdown comes first.)"""
    db = tmp_path / "store.db"
    store = SQLiteStore(db)
    store.create_run(RUN)
    for rollout_id in ("broken", "control"):
        store.create_rollout(rollout_id=rollout_id, run_id=RUN, task={"prompt": "p"})
    command = harness(db, "metadata", "broken", then_wait=True)
    controller = make_controller(store, tmp_path, command, poll_s=3600)

    async def go():
        stop = asyncio.Event()
        loop = asyncio.create_task(controller.run_forever(stop))
        try:
            await wait_for(
                lambda: row(db, "broken")["metadata"] == "{damaged", "the harness to damage its row"
            )
            await wait_for(lambda: row(db, "control")["status"] == "finished", "the control rollout")
        finally:
            stop.set()
            await loop

    asyncio.run(go())
    damaged = row(db, "broken")
    assert damaged["status"] == "failed" and damaged["outcome"] == "infra_failure", damaged
    assert "rollout broken" in str(damaged["error"]) and "metadata" in str(damaged["error"])
    assert store.get_rollout("control").reward == 1.0
    store.close()


def test_run_until_done_gives_back_a_row_damaged_meanwhile_as_ended(tmp_path):
    """``harnessrl rollout`` and ``data calibrate`` wait with ``run_until_done``: it read every row
    whole and raised ``RolloutUnreadable`` at its first poll after the damage, which stopped the
    whole command (a calibration batch's other rollouts requeued unscored). Now the damaged one is
    given back as its plain columns tell, ended failed, and the control beside it with its reward."""
    db = tmp_path / "store.db"
    store = SQLiteStore(db)
    store.create_run(RUN)
    for rollout_id in ("broken", "control"):
        store.create_rollout(rollout_id=rollout_id, run_id=RUN, task={"prompt": "p"})
    controller = make_controller(store, tmp_path, harness(db, "metadata", "broken"))

    async def go():
        try:
            return await controller.run_until_done(["broken", "control"], timeout_s=PATIENCE_S)
        finally:
            await controller.shutdown()

    broken, control = asyncio.run(go())
    assert (broken.rollout_id, broken.status.value, broken.outcome.value) == (
        "broken",
        "failed",
        "infra_failure",
    )
    assert "rollout broken" in str(broken.error) and "metadata" in str(broken.error)
    assert broken.api_key == "" and broken.metadata == {}  # nothing of the damaged columns guessed
    assert (control.status.value, control.reward) == ("finished", 1.0)
    assert row(db, "broken")["metadata"] == "{damaged"
    store.close()


def test_run_until_done_still_names_a_row_whose_plain_columns_are_damaged(tmp_path):
    """Control: a row whose status itself cannot be read tells nothing about when it ends; the wait
    raises the named error (the CLI prints it) rather than wait for ever or guess an end."""
    db = tmp_path / "store.db"
    store = SQLiteStore(db)
    store.create_run(RUN)
    store.create_rollout(rollout_id="broken", run_id=RUN, task={"prompt": "p"})
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE rollouts SET task = '{damaged', attempt = 'x' WHERE rollout_id = 'broken'")
    controller = make_controller(store, tmp_path, harness(db, "task", "none"))

    async def go():
        try:
            return await controller.run_until_done(["broken"], timeout_s=PATIENCE_S)
        finally:
            await controller.shutdown()

    with pytest.raises(RolloutUnreadable, match="rollout broken"):
        asyncio.run(go())
    store.close()
