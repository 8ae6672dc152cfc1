"""A rollout the trainer cancels for running past ``trainer.rollout_deadline_s`` (``cancelled_stuck``)
after its final attempt sampled the policy counts as reward 0 in its group's baseline: the trainer
cannot tell a stall the policy caused (an attempt phase its code or its workspace drags out) from
one it did not, and a 0 left uncounted is one a policy can learn to reach (docs/train.md, "A rollout
that never ends"). One that never called the model stays out, as an infrastructure failure."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from tests.fakes.processes import processes_running
from tests.trainer.test_train_end_to_end import CONFIG, metrics, train

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.schemas import Call, Outcome, RolloutStatus, Task
from harnessrl.store import open_store
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.trainer.config import TrainerSection
from harnessrl.trainer.fleet import RolloutBook
from harnessrl.trainer.schedule import TaskSchedule
from harnessrl.trainer.step import prepare_step

RUN = "run"
TASKS = [Task(task_id="t0", split="train", data={"prompt": "task 0"})]


def call(rollout_id: str, token: int) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[token, token + 1],
        response_logprobs=[-0.5, -0.25],
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={},
    )


def stuck_group(tmp_path: Any, *, stuck_called: bool) -> tuple[Any, list[str], Any]:
    """A group of three: r0 still running past the deadline (having called the model when
    ``stuck_called``), r1 and r2 finished with rewards 1 and 0 after one call each. The book's
    clock is moved past the deadline by hand."""
    store = open_store(str(tmp_path / "store.db"))
    store.create_run(RUN)
    now = [0.0]
    book = RolloutBook(store, RUN, poll_s=3600.0, deadline_s=60.0, clock=lambda: now[0])
    plan = TaskSchedule(TASKS, 3, seed=0).group(0)
    stuck, high, low = plan.rollout_ids

    async def main() -> Any:
        await book.submit([plan])
        claimed = store.claim_rollouts("w", 3, run_id=RUN)
        assert len(claimed) == 3
        for k, rollout_id in enumerate(plan.rollout_ids):
            if rollout_id != stuck or stuck_called:
                store.add_call(call(rollout_id, 10 + k))
        store.finish_rollout(high, Outcome.SUCCESS, 1.0)
        store.finish_rollout(low, Outcome.POLICY_FAILURE, 0.0)
        now[0] = max(r.started_at for r in claimed) + 61.0
        book.notify()
        return await asyncio.wait_for(book.completed(1), 600)

    [group] = asyncio.run(main())
    cancelled = store.get_rollout(stuck)
    assert cancelled.status is RolloutStatus.CANCELLED and "cancelled_stuck" in cancelled.metadata
    assert cancelled.reward is None  # the store's record is unchanged: the step decides what it counts
    store.close()
    return group, [stuck, high, low], cancelled


def test_a_stuck_rollout_that_sampled_the_policy_counts_as_reward_0_in_its_baseline(tmp_path):
    group, (stuck, high, low), _ = stuck_group(tmp_path, stuck_called=True)
    batch = prepare_step([group], 0, TrainerSection(), AlgorithmConfig())
    advantages = {s.rollout_id: s.advantage for s in batch.samples}
    # Rewards [0, 1, 0]: the baseline is 1/3, the stuck rollout's sample is trained as a failure.
    assert set(advantages) == {stuck, high, low}
    assert advantages[stuck] == pytest.approx(advantages[low]) and advantages[stuck] < 0 < advantages[high]
    assert batch.metrics["rollouts/cancelled_stuck"] == 1 and batch.metrics["rollouts/no_reward"] == 0
    assert batch.metrics["reward/mean"] == pytest.approx(1 / 3)


def test_a_stuck_rollout_that_never_called_the_model_stays_out_of_its_baseline(tmp_path):
    """The control: the probe above notices a rollout left out (here the rule keeps it out)."""
    group, (stuck, high, low), _ = stuck_group(tmp_path, stuck_called=False)
    batch = prepare_step([group], 0, TrainerSection(), AlgorithmConfig())
    advantages = {s.rollout_id: s.advantage for s in batch.samples}
    assert set(advantages) == {high, low} and advantages[high] == pytest.approx(-advantages[low])
    assert batch.metrics["rollouts/cancelled_stuck"] == 1 and batch.metrics["rollouts/no_reward"] == 1
    assert batch.metrics["reward/mean"] == pytest.approx(0.5)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
def test_a_harness_that_outlives_the_deadline_after_calling_the_model_is_trained_as_reward_0(tmp_path):
    """Through ``harnessrl train``: every group's first rollout calls the model, then its attempt
    goes on past the deadline (here the harness itself sleeps; any attempt phase the policy can drag
    out looks the same to the trainer). The trainer cancels it and trains it as a 0 in its group."""
    agent = tmp_path / "calls_then_hangs_on_r0.py"
    main = 'if __name__ == "__main__":\n    main()\n'
    hang = (
        "    if os.environ['HARNESSRL_ROLLOUT_ID'].endswith('-r0'):\n        __import__('time').sleep(3600)\n"
    )
    source = (CONFIG.parent / "agent.py").read_text()
    assert main in source
    agent.write_text(source.replace(main, main + hang))
    agent.chmod(0o755)
    run_dir = tmp_path / "run"
    proc = train(
        run_dir,
        "--set", f'harness.command=["{agent}", "{{prompt}}"]',
        "--set", "harness.timeout_s=3600",
        # the healthy rollouts (a few seconds) must end inside it on a loaded machine too
        "--set", "trainer.rollout_deadline_s=40",
        "--set", "trainer.mode=sync",
        "--set", "trainer.steps=1",
        "--set", "trainer.tasks_per_step=2",
        "--set", "trainer.group_size=3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = [r for r in metrics(run_dir) if "rollouts/total" in r]
    assert row["rollouts/total"] == 6 and row["rollouts/cancelled_stuck"] == 2
    # In their groups' baselines (no rollout without a reward), trained or dropped with their group.
    assert row["rollouts/no_reward"] == 0
    assert row["rollouts/trained"] + row["rollouts/dropped_zero_variance"] == 6
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        stuck = [r for r in store.list_rollouts(run_id="tiny-vowels") if "cancelled_stuck" in r.metadata]
        assert len(stuck) == 2
        for rollout in stuck:
            assert rollout.status is RolloutStatus.CANCELLED and rollout.reward is None
            assert rollout.rollout_id.endswith("-r0")
            assert [c.attempt for c in store.list_calls(rollout.rollout_id)] == [rollout.attempt]  # it called
    finally:
        store.close()
    assert processes_running(str(agent)) == []  # nothing of the run is left running
