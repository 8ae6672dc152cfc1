"""docs/verl.md's wiring sketch, its harnessrl part run as written against a real SQLite store.

The sketch picks one step's rollouts from the run's store as ``prepare_step`` does. A held-out
evaluation of that step is stored with the same ``run_id`` and ``step``: the sketch must not train
on it. A rollout cancelled as stuck after it sampled the policy has no reward in the store: the
sketch must score it 0, as ``prepare_step`` does, not leave it out. Needs no verl: only
the sketch's harnessrl lines run (the ``harnessrl.integrations`` import, which needs verl, is left
out: ``tests/integrations/test_verl.py`` covers that part).
"""

from __future__ import annotations

import re
from pathlib import Path

from harnessrl.algorithms import AlgorithmConfig
from harnessrl.schemas import Call, Outcome
from harnessrl.store import open_store
from harnessrl.trainer.failures import CANCELLED_STUCK_KEY
from harnessrl.trainer.schedule import EVAL_KIND, TRAIN_KIND

DOC = Path(__file__).resolve().parents[2] / "docs" / "verl.md"


def documented_step_selection() -> str:
    """The sketch's harnessrl imports and its lines from ``rollouts =`` to ``samples =``."""
    section = DOC.read_text().split("## Wiring a verl trainer", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "docs/verl.md lost its wiring sketch"
    lines = block.group(1).splitlines()
    imports = [
        line
        for line in lines
        if line.startswith("from harnessrl") and not line.startswith("from harnessrl.integrations")
    ]
    start = next(i for i, line in enumerate(lines) if line.startswith("rollouts ="))
    end = next(i for i, line in enumerate(lines) if line.startswith("samples ="))
    return "\n".join(imports + lines[start : end + 1])


def add_rollout(
    store, rollout_id: str, group_id: str, kind: str, task_id: str, reward: float | None, stuck: bool = False
) -> None:
    """An ended rollout with one model call, stored as the trainer's fleet stores it; ``stuck``: still
    running past its deadline after that call, so the trainer cancelled it (no reward)."""
    store.create_rollout(
        rollout_id=rollout_id,
        run_id="run",
        task_id=task_id,
        group_id=group_id,
        step=3,
        metadata={"kind": kind},
    )
    store.start_rollout(rollout_id)
    store.add_call(
        Call(
            rollout_id=rollout_id,
            seq=0,
            prompt_token_ids=[1, 2, 3],
            response_token_ids=[4, 5],
            response_logprobs=[-0.1, -0.2],
            policy_version=3,
        )
    )
    if stuck:
        store.cancel_rollout(rollout_id)
        store.update_rollout_metadata(
            rollout_id, {CANCELLED_STUCK_KEY: {"attempt": 0, "running_s": 900.0, "deadline_s": 600.0}}
        )
    else:
        store.finish_rollout(rollout_id, Outcome.SUCCESS, reward)


def run_documented_selection(store) -> dict[str, float]:
    """rollout id -> advantage of each sample the documented lines select for step 3."""
    scope = {"store": store, "run_id": "run", "step": 3, "algorithm": AlgorithmConfig()}
    exec(documented_step_selection(), scope)
    return {s.rollout_id: s.advantage for s in scope["samples"]}


def test_the_documented_step_selection_trains_no_held_out_rollout(tmp_path):
    store = open_store(str(tmp_path / "harnessrl.db"))
    try:
        store.create_run("run")
        for k, reward in enumerate([1.0, 0.0]):  # one training group of task t0
            add_rollout(store, f"run-g000007-r{k}", "g000007", TRAIN_KIND, "t0", reward)
        for k, reward in enumerate([1.0, 0.0]):  # the held-out evaluation at the same step
            add_rollout(store, f"run-eval-s00003-t{k:04d}", "eval-s00003", EVAL_KIND, f"h{k}", reward)
        trained = run_documented_selection(store)
    finally:
        store.close()
    # The training group is trained (the probe sees samples at all) ...
    assert set(trained) >= {"run-g000007-r0", "run-g000007-r1"}
    assert trained["run-g000007-r0"] > 0 > trained["run-g000007-r1"]
    # ... and no held-out rollout is: with the eval group selected too, its two tasks formed one GRPO
    # "group" and got advantages +-0.71, training on the held-out set.
    assert not [rid for rid in trained if "eval" in rid]


def test_the_documented_step_selection_scores_a_stuck_rollout_that_sampled_the_policy_zero(tmp_path):
    """prepare_step's rule (docs/train.md, "A rollout that never ends"): the sketch left such a
    rollout out as "no reward", so stalling after a bad answer spared the policy its 0."""
    store = open_store(str(tmp_path / "harnessrl.db"))
    try:
        store.create_run("run")
        add_rollout(store, "run-g000007-r0", "g000007", TRAIN_KIND, "t0", 1.0)
        add_rollout(store, "run-g000007-r1", "g000007", TRAIN_KIND, "t0", None, stuck=True)
        assert store.get_rollout("run-g000007-r1").reward is None  # control: what the store holds
        trained = run_documented_selection(store)
    finally:
        store.close()
    assert trained["run-g000007-r1"] < 0 < trained["run-g000007-r0"]
