"""A run killed mid-way and resumed: the real ``TrainingLoop``, ``GatewayFleet``, ``RolloutBook``,
``Checkpointer`` and ``MetricsWriter`` over a SQLite store, with protocol fakes for what needs a
model (the policy, an in-process engine behind a ``GatewayControl``) and a controller that answers
each claimed rollout with one call labelled by the engine's version.

Two kill windows: while step N+1's checkpoint is still written in the background (generation has
resumed under N+1, its metrics row is written), and during a held-out evaluation (its step's row
is written only after it). ``resume`` does what ``Trainer.run`` does around the loop on
``--resume``: reopen the groups from the checkpoint, restore the engine to its version.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
from harnessrl.engines.base import WeightUpdate
from harnessrl.schemas import Call, Outcome, Task
from harnessrl.store import open_store
from harnessrl.trainer.checkpoint import STATE_FILE, Checkpointer, TrainState, latest_checkpoint
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.fleet import DISCARDED_WEIGHTS_KEY, RolloutBook
from harnessrl.trainer.fleet_gateway import GatewayFleet
from harnessrl.trainer.loop import TrainingLoop, finished_at
from harnessrl.trainer.metrics import MetricsWriter, read_metrics
from harnessrl.trainer.schedule import EVAL_KIND, TaskSchedule

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"
RUN = "killed"
TASKS = [Task(task_id=f"t{i}", split="train", data={"prompt": f"task {i}"}) for i in range(3)]
HELDOUT = [Task(task_id=f"h{i}", split="heldout", data={"prompt": f"held-out {i}"}) for i in range(2)]


def config(*overrides: str) -> TrainConfig:
    sets = ["trainer.mode='sync'", "trainer.tasks_per_step=1", "trainer.group_size=2", f"run.name='{RUN}'"]
    raw = resolve_relative_paths(load_raw_config(str(CONFIG), [*sets, *overrides]), CONFIG.parent)
    return validate_config(TrainConfig, raw)


class Engine:
    """An engine holding its own weights in this process: it labels calls with its version."""

    shares_weights = False

    def __init__(self) -> None:
        self.policy_version = 0

    async def release_weights(self) -> bool:
        return False


class Gateway:
    """A ``GatewayControl``: the gate the fake controller waits on, and the engine."""

    base_url = "in-process"

    def __init__(self) -> None:
        self._engine = Engine()
        self.open = asyncio.Event()
        self.open.set()

    @property
    def engine(self) -> Engine:
        return self._engine

    async def pause(self) -> dict[str, Any]:
        self.open.clear()
        return {"drained": True}

    async def resume(self, version: int | None, *, rewind: bool) -> None:
        self.open.set()

    async def update_weights(self, update: WeightUpdate) -> None:
        self._engine.policy_version = update.version

    async def on_engine_loop(self, make: Callable[[], Awaitable[Any]]) -> Any:
        return await make()


class Policy:
    """Records the rollouts each step trained on. ``die_on_save``: the save (1-based) that never
    completes, as when the process is killed while a checkpoint is written in the background."""

    def __init__(self, die_on_save: int | None = None) -> None:
        self.trained: list[set[str]] = []
        self.saves = 0
        self.die_on_save = die_on_save
        self.killed = threading.Event()

    def train_step(self, samples, algorithm, *, temperature, micro_batch_tokens) -> dict[str, float]:  # noqa: ANN001
        self.trained.append({s.rollout_id for s in samples})
        return {}

    def engine_state_dict(self) -> dict[str, Any]:
        return {}

    def save_checkpoint(self, folder: Path, *, with_optimizer: bool = True) -> None:
        self.saves += 1
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "weights.txt").write_text(str(self.saves))
        if self.saves == self.die_on_save:
            self.killed.wait()
            raise RuntimeError("the process died while writing this checkpoint")


class Controller:
    """Claims the run's rollouts while the gate is open and finishes each with one call labelled by
    the engine's version (reward 1 for ``-r0``, else 0: groups with a signal; a held-out rollout
    gets ``eval_reward``). ``hold_eval_at``: the held-out rollouts of that step's evaluation are
    claimed but left running (in progress)."""

    def __init__(
        self, store: Any, book: RolloutBook, gateway: Gateway, *, hold_eval_at: int | None, eval_reward: float
    ) -> None:
        self.store, self.book, self.gateway, self.hold_eval_at = store, book, gateway, hold_eval_at
        self.eval_reward = eval_reward
        self.versions_finished: dict[int, asyncio.Event] = {}
        self.eval_claimed = asyncio.Event()
        self.evals_finished: dict[int, list[str]] = {}
        self.evaluation_done: dict[int, asyncio.Event] = {}

    def evaluated(self, step: int) -> asyncio.Event:
        """Set once every held-out rollout of the evaluation at ``step`` finished."""
        return self.evaluation_done.setdefault(step, asyncio.Event())

    def finished_version(self, version: int) -> asyncio.Event:
        return self.versions_finished.setdefault(version, asyncio.Event())

    async def run(self) -> None:
        while True:
            await self.gateway.open.wait()
            claimed = self.store.claim_rollouts("fake-controller", 16, run_id=RUN)
            for rollout in claimed:
                if rollout.metadata.get("kind") == EVAL_KIND and rollout.step == self.hold_eval_at:
                    self.eval_claimed.set()
                    continue
                version = self.gateway.engine.policy_version
                call = Call(
                    rollout_id=rollout.rollout_id,
                    attempt=rollout.attempt,
                    prompt_token_ids=[1, 2, 3],
                    response_token_ids=[4, 5],
                    response_logprobs=[-0.5, -0.5],
                    policy_version=version,
                )
                self.store.add_call(call)
                if rollout.metadata.get("kind") == EVAL_KIND:
                    reward = self.eval_reward
                    done = self.evals_finished.setdefault(rollout.step, [])
                    done.append(rollout.rollout_id)
                    if len(done) == len(HELDOUT):
                        self.evaluated(rollout.step).set()
                else:
                    reward = 1.0 if rollout.rollout_id.endswith("-r0") else 0.0
                self.store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, reward)
                self.finished_version(version).set()
            self.book.notify()
            await asyncio.sleep(0.01)  # the fake's poll interval, not something a test waits for


class Life:
    """One process's life on the run folder and the store: what ``Trainer.run`` builds."""

    def __init__(
        self,
        run_dir: Path,
        cfg: TrainConfig,
        policy: Policy,
        *,
        hold_eval_at: int | None = None,
        eval_reward: float = 0.0,
    ) -> None:
        self.cfg, self.policy = cfg, policy
        self.store = open_store(str(run_dir / "harnessrl.db"))
        self.store.create_run(RUN)
        self.book = RolloutBook(self.store, RUN, poll_s=0.05)
        self.gateway = Gateway()
        self.fleet = GatewayFleet(self.book, self.gateway, weights_root=run_dir / "engine-weights")
        self.controller = Controller(
            self.store, self.book, self.gateway, hold_eval_at=hold_eval_at, eval_reward=eval_reward
        )
        folder = latest_checkpoint(run_dir)
        self.state = TrainState.from_json((folder / STATE_FILE).read_text()) if folder else TrainState()
        self.checkpointer = Checkpointer(policy, run_dir, save_every=0, background=True)
        self.metrics = MetricsWriter(
            run_dir, tensorboard=False, wandb_project=None, run_name=RUN, progress=False
        )
        self.schedule = TaskSchedule(TASKS, 2, cfg.run.seed, id_prefix=self.book.rollout_id_prefix())

    async def loop(self) -> TrainingLoop:
        """Reopen what an earlier life left (``Trainer._reopen``) and restore the engine's version."""
        consumed = set(self.state.consumed_groups)

        def reopened(created: int) -> list[Any]:
            plans = [self.schedule.group(i, step=self.state.step) for i in range(created)]
            return [p for p in plans if p.group_id not in consumed]

        created = await self.fleet.recover(reopened, policy_version=self.state.step)
        self.schedule.redo_evaluations(await self.fleet.retire_evaluations(self.state.step))
        if self.state.step > 0:
            await self.fleet.publish(self.state.step, self.policy, restore=True)
        return TrainingLoop(
            self.cfg,
            self.fleet,
            self.policy,  # type: ignore[arg-type]
            self.schedule,
            self.state,
            self.checkpointer,
            self.metrics,
            heldout=HELDOUT,
            groups_created=created,
        )

    async def run_until(self, killed: Callable[[], Awaitable[Any]]) -> None:
        """Run the loop until ``killed()`` returns, then stop everything (a SIGKILL: nothing of the
        loop runs after it; a checkpoint being written never completes)."""
        loop = await self.loop()
        controller = asyncio.create_task(self.controller.run())
        training = asyncio.create_task(loop.run())
        try:
            await asyncio.wait_for(killed(), 600)  # a guard against a hang, not a timing
            assert not training.done(), training
        finally:
            self.policy.killed.set()  # a checkpoint being written fails: the loop waiting on it ends
            for task in (training, controller):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                    await task
            self.store.close()

    async def run_to_the_end(self) -> None:
        loop = await self.loop()
        controller = asyncio.create_task(self.controller.run())
        try:
            await asyncio.wait_for(loop.run(), 600)
            await self.checkpointer.written()
        finally:
            controller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await controller
            self.store.close()


def steps_of_rows(run_dir: Path) -> list[int]:
    return [row["step"] for row in read_metrics(run_dir)]


def test_a_kill_while_the_checkpoint_is_written_retrains_that_step_once_and_not_on_lost_weights(tmp_path):
    cfg = config("trainer.steps=3")
    # The checkpoint of step 2 never completes; the kill comes once the engine sampled with step 2's
    # weights (published before the checkpoint, which is written while generation goes on).
    first = Life(tmp_path, cfg, Policy(die_on_save=2))
    asyncio.run(first.run_until(lambda: first.controller.finished_version(2).wait()))
    assert latest_checkpoint(tmp_path) is not None
    assert TrainState.from_json((latest_checkpoint(tmp_path) / STATE_FILE).read_text()).step == 1
    assert steps_of_rows(tmp_path) == [1, 2]  # step 2's row was written before its checkpoint
    store = open_store(str(tmp_path / "harnessrl.db"))
    lost = {c.rollout_id for r in store.list_rollouts(run_id=RUN) for c in store.list_calls(r.rollout_id)}
    lost = {rid for rid in lost if any(c.policy_version == 2 for c in store.list_calls(rid))}
    store.close()
    assert lost  # rollouts the lost weights of step 2 sampled

    second = Life(tmp_path, cfg, Policy())
    asyncio.run(second.run_to_the_end())
    # Step 2 trained again, and its row written once: not two rows for one step.
    assert steps_of_rows(tmp_path) == [1, 2, 3]
    assert len(second.policy.trained) == 2 and second.state.step == 3
    # What the lost weights sampled is labelled 2, as the retrained step-2 weights are; it is not
    # trained as theirs (it used to be, at staleness 0, in sync mode).
    trained = set().union(*second.policy.trained)
    assert not lost & trained
    store = open_store(str(tmp_path / "harnessrl.db"))
    marks = {rid: store.get_rollout(rid).metadata.get(DISCARDED_WEIGHTS_KEY) for rid in lost}
    store.close()
    assert all(mark == {"versions": [2], "resumed_at_step": 1} for mark in marks.values()), marks


@pytest.mark.parametrize("cut_at", [2, 3])
def test_an_evaluation_cut_short_runs_on_resume_the_final_one_included(tmp_path, cut_at):
    # Evaluations at 0, 2 and 3 (the last step); the one at ``cut_at`` is stopped half-way.
    cfg = config(f"trainer.steps={cut_at}", "trainer.eval_every=2")
    first = Life(tmp_path, cfg, Policy(), hold_eval_at=cut_at)

    async def evaluation_at_cut_started() -> None:
        await first.controller.eval_claimed.wait()
        await first.checkpointer.written()  # the step's checkpoint is whole; its evaluation is not

    asyncio.run(first.run_until(evaluation_at_cut_started))
    assert TrainState.from_json((latest_checkpoint(tmp_path) / STATE_FILE).read_text()).step == cut_at
    assert steps_of_rows(tmp_path) == list(range(cut_at))
    if cut_at == cfg.trainer.steps:  # the CLI would have said "already finished"
        assert finished_at(tmp_path, cfg, heldout=True) is None

    final = config("trainer.steps=3", "trainer.eval_every=2")
    second = Life(tmp_path, final, Policy())
    asyncio.run(second.run_to_the_end())
    rows = {row["step"]: row for row in read_metrics(tmp_path)}
    assert sorted(rows) == [0, 1, 2, 3] and steps_of_rows(tmp_path) == [0, 1, 2, 3]
    assert all("heldout/reward" in rows[s] for s in (0, 2, 3))
    # The step whose evaluation was cut short keeps its training metrics (from its checkpoint),
    # which its row used to lose: only the evaluation's were written.
    assert rows[cut_at]["policy_version"] == cut_at and rows[cut_at]["rollouts/total"] == 2
    assert rows[cut_at]["reward/mean"] == 0.5  # the fake's group: rewards 1 and 0
    assert finished_at(tmp_path, final, heldout=True) == 3


class Killed(Exception):
    """The process is killed (the fake's stand-in for SIGKILL inside ``MetricsWriter.write``)."""


class RowKilled(MetricsWriter):
    """A metrics writer whose process is killed just before it writes the row of ``step``."""

    def __init__(self, run_dir: Path, step: int) -> None:
        super().__init__(run_dir, tensorboard=False, wandb_project=None, run_name=RUN, progress=False)
        self.step = step

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if step == self.step:
            raise Killed(f"killed before the row of step {step}")
        super().write(step, metrics)


@pytest.mark.parametrize("killed_at", [2, 3])
def test_a_kill_after_the_checkpoint_but_before_its_row_loses_no_row(tmp_path, killed_at):
    # No evaluation: the kill comes once step ``killed_at``'s checkpoint is whole, before its row
    # (the last step's included, which a plain --resume then must not call "already finished").
    cfg = config("trainer.steps=3")
    first = Life(tmp_path, cfg, Policy())
    first.metrics = RowKilled(tmp_path, killed_at)

    async def killed_before_the_row() -> None:
        loop = await first.loop()
        controller = asyncio.create_task(first.controller.run())
        try:
            with pytest.raises(Killed):
                await asyncio.wait_for(loop.run(), 600)  # a guard against a hang, not a timing
            await first.checkpointer.written()  # whole: the kill came after it
        finally:
            controller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await controller
            first.store.close()

    asyncio.run(killed_before_the_row())
    assert TrainState.from_json((latest_checkpoint(tmp_path) / STATE_FILE).read_text()).step == killed_at
    assert steps_of_rows(tmp_path) == list(range(1, killed_at))
    assert finished_at(tmp_path, cfg, heldout=False) is None  # the row is work left

    second = Life(tmp_path, cfg, Policy())
    asyncio.run(second.run_to_the_end())
    rows = {row["step"]: row for row in read_metrics(tmp_path)}
    assert steps_of_rows(tmp_path) == [1, 2, 3]
    assert rows[killed_at]["policy_version"] == killed_at and rows[killed_at]["reward/mean"] == 0.5
    assert len(second.policy.trained) == 3 - killed_at  # the step is not trained again
    assert finished_at(tmp_path, cfg, heldout=False) == 3


def test_a_kill_while_the_checkpoint_is_written_redoes_the_evaluation_the_lost_weights_ran(tmp_path):
    cfg = config("trainer.steps=3", "trainer.eval_every=2")
    # Step 2's checkpoint never completes; the kill comes once step 2's evaluation, which ran on the
    # weights published before that checkpoint (lost with the kill), has finished: reward 0 each.
    first = Life(tmp_path, cfg, Policy(die_on_save=2), eval_reward=0.0)
    asyncio.run(first.run_until(lambda: first.controller.evaluated(2).wait()))
    assert TrainState.from_json((latest_checkpoint(tmp_path) / STATE_FILE).read_text()).step == 1
    lost = first.controller.evals_finished[2]

    second = Life(tmp_path, cfg, Policy(), eval_reward=1.0)
    asyncio.run(second.run_to_the_end())
    rows = {row["step"]: row for row in read_metrics(tmp_path)}
    assert steps_of_rows(tmp_path) == [0, 1, 2, 3]
    assert rows[0]["heldout/reward"] == 0.0  # control: before the checkpoint, the first life's stands
    # Step 2 trained again and evaluated on its new weights, not read back from the lost weights'.
    assert rows[2]["heldout/reward"] == 1.0 and rows[3]["heldout/reward"] == 1.0
    store = open_store(str(tmp_path / "harnessrl.db"))
    marks = {rid: store.get_rollout(rid).metadata.get(DISCARDED_WEIGHTS_KEY) for rid in lost}
    redone = [r for r in store.list_rollouts(run_id=RUN) if r.group_id == "eval-s00002-redo1"]
    store.close()
    assert all(mark == {"versions": [2], "resumed_at_step": 1} for mark in marks.values()), marks
    assert len(redone) == len(HELDOUT) and all(r.reward == 1.0 for r in redone)
