"""docs/metrics.md names every metric ``harnessrl train`` writes, and nothing it does not write.

The names are collected from a real step: ``prepare_step`` on completed groups, ``train_step`` on the
tiny model with every optional metric switched on (KL penalty, trainer proximal, ``tis_cap``) and a
step with nothing to train, and a held-out evaluation. What the training loop (``TrainingLoop._step``)
and the torchrun reducer (``ShardedRanks.metrics``) add is read from their dict literals, and
``MetricsWriter.write`` adds the ``step`` and ``time`` of every row.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from tests.trainer.test_prepare_step import group

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.trainer.config import TrainerSection
from harnessrl.trainer.policy import TrainablePolicy
from harnessrl.trainer.step import heldout_metrics, prepare_step
from harnessrl.trainer.train_step import train_step

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "src" / "harnessrl" / "trainer"


def documented() -> set[str]:
    """The backticked names in the first cell of every table row of docs/metrics.md."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def literal_keys(path: Path, function: str) -> set[str]:
    """String keys of the dicts ``function`` assigns to ``metrics`` or returns, and of its
    ``metrics["..."] = ...`` assignments."""
    [node] = [
        n
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function
    ]

    def is_metrics(target: ast.expr) -> bool:
        return isinstance(target, ast.Name) and target.id == "metrics"

    keys: set[str] = set()
    for n in ast.walk(node):
        targets = [n.target] if isinstance(n, ast.AnnAssign) else getattr(n, "targets", [])
        value = getattr(n, "value", None)
        if isinstance(value, ast.Dict) and (isinstance(n, ast.Return) or any(map(is_metrics, targets))):
            keys.update(
                k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
        for t in targets:
            if isinstance(t, ast.Subscript) and is_metrics(t.value) and isinstance(t.slice, ast.Constant):
                keys.add(t.slice.value)
    return keys


@functools.cache
def written() -> frozenset[str]:
    groups = [group("g0", [1.0, 0.0, 1.0]), group("g1", [0.5, 0.5, 0.5])]
    batch = prepare_step(groups, 0, TrainerSection(), AlgorithmConfig())
    everything = AlgorithmConfig(kl_coef=0.1, proximal="trainer", tis_cap=2.0, dual_clip=3.0)
    policy = TrainablePolicy(tiny_model_dir(), total_steps=2, reference_dir=tiny_model_dir())
    trained = train_step(policy.learner, batch.samples, everything, temperature=1.0, micro_batch_tokens=64)
    skipped = train_step(policy.learner, [], everything, temperature=1.0, micro_batch_tokens=64)
    loop = literal_keys(TRAINER / "loop.py", "_step")
    ranks = literal_keys(TRAINER / "distributed.py", "metrics")
    assert {"time/step_s", "policy_version"} <= loop, loop  # the parse found the loop's dict
    assert ranks == {"policy/world_size"}, ranks
    heldout = heldout_metrics(group("eval-s00000", [1.0, 0.0]), overlap=0)
    return frozenset({"step", "time", *batch.metrics, *trained, *skipped, *heldout, *loop, *ranks})


def test_every_metric_the_trainer_writes_is_documented_and_every_documented_one_is_written():
    names, docs = written(), documented()
    assert sorted(names - docs) == []  # written, not in docs/metrics.md
    assert sorted(docs - names) == []  # in docs/metrics.md, no longer written (renamed or removed)


def test_each_metric_is_one_name():
    """The duplicates that used to be logged are gone: each count under one name."""
    names = written()
    for old in ("rollouts", "kl", "entropy", "loss", "loss_tokens", "loss/loss_tokens", "samples",
                "advantage/rollouts", "advantage/reward_mean", "advantage/excluded_infra_failure",
                "trajectory/rollouts_skipped_infra", "advantage/zero_variance_groups_dropped",
                "heldout/accuracy"):  # fmt: skip
        assert old not in names, old
    assert all("/" in name for name in names - {"step", "time", "policy_version"})
